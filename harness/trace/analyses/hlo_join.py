"""JAX kernels to model layers: a profile's kernels joined to XLA's optimized HLO schedule.

The JAX model labels its ops with `jax.named_scope` (``layers.3``/``attn``...), which XLA
keeps as each HLO instruction's ``metadata={op_name="jit(f)/jvp(layers.3)/attn/dot_general"}``.
A kernel in a profile carries no op_name, and names alone join almost nothing: XLA names
a fusion's kernel after the fusion, but identical fusions share one kernel named after the
first of them it compiled, and library calls run kernels with the library's names. So the
join follows the schedule:

- the source `harness.trace.sources.hlo` reads the optimized HLO text
  (``compiled.as_text()``, `parse_hlo`) into computations and instructions.
- `schedule` lists the entry computation in execution order (the module is scheduled),
  inlining ``call``s (XLA's command buffers are outlined computations) and async
  wrappers. Each fusion is an *anchor*: its kernel bears the name (with '.' as '_') of
  some fusion of its class, the one XLA compiled first: the fusions of one
  ``deduplicated_name``, or, where none is recorded, those with identical fused
  computations. Library calls (custom-calls, cuDNN/cuBLAS fusions), copies and control
  flow are *gap* items. A fusion's layer is the most common canonical layer among its
  fused instructions' op_names (the first on ties), since XLA fuses across scope boundaries.
- `join_kernels` maps kernels to items position by position where the phase ran exactly
  one kernel per item (checked by the anchors' names); otherwise it aligns the kernels, in
  start order, to the anchors (`harness.trace.analyses.seq_align`: a longest order-preserving
  matching, kernels that concurrency started out of order placed within a window); a
  kernel that is none goes to the gap items between its neighbouring matched anchors,
  only where that is unambiguous (one layer among the candidates, or one kernel per
  candidate). Everything else stays unjoined: a kernel whose place two layers could
  claim, or that fits nowhere, is labelled "(outside layers)" and lowers the reported
  coverage, which is never made up by guessing.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.common.layer_names import canonical_layer
from harness.trace.analyses.seq_align import align, repair
from harness.trace.kernels import is_autotuning
from harness.trace.profile import KERNEL, MEMCPY, MEMSET, KernelTable, Range
from harness.trace.sources.hlo import HloModule, Instruction, read_hlo_dir
from harness.trace.sources.hlo import hlo_dir as hlo_dir  # where a profile's HLO lies, said here too
from harness.trace.sources.hlo import parse_hlo as parse_hlo

OUTSIDE = "(outside layers)"
POSITIONAL_AGREEMENT = 0.98  # share of fusion kernels bearing a name of their instruction's group
# Ops that launch nothing on the GPU (aliases, metadata, the second half of async pairs).
SILENT_OPS = frozenset({
    "parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all", "add-dependency",
    "opt-barrier", "partition-id", "replica-id", "domain", "get-dimension-size", "iota",
})
INLINED_OPS = frozenset({"call", "async-start"})
COPY_OPS = frozenset({"copy", "copy-start"})
HEAVY_OPS = frozenset({"dot", "convolution", "custom-call"})
HOW_NONE, HOW_ANCHOR, HOW_GAP, HOW_IGNORED = 0, 1, 2, 3

_TRANSFORM = re.compile(r"^[\w\-]+\((.*)\)$")


@dataclass(frozen=True)
class ScheduleItem:
    """One GPU-launching instruction of the schedule, with the layer its work belongs to."""

    instruction: Instruction
    kind: str  # "anchor" (a fusion), "call" (library or control flow), "copy"
    layer: str  # canonical layer, or OUTSIDE
    kernel_names: frozenset[str] = frozenset()  # anchors: the names its kernel may bear
    primitives: frozenset[str] = frozenset()  # the JAX primitives it computes (`instruction_ops`)
    directions: frozenset[str] = frozenset()  # "forward", "backward": where in autodiff they come from


def scope_path(op_name: str) -> str:
    """An op_name's scope path with JAX's transform wrappers peeled off:
    ``jit(f)/transpose(jvp(layers.3))/attn/dot_general`` -> ``f/layers.3/attn/dot_general``."""
    parts = []
    for part in op_name.split("/"):
        while m := _TRANSFORM.match(part):
            part = m.group(1)
        parts.append(part)
    return "/".join(parts)


def op_layer(op_name: str | None) -> str | None:
    """The canonical layer an op_name's scopes name, None if none."""
    return canonical_layer(scope_path(op_name)) if op_name else None


def _fused(module: HloModule, instr: Instruction, fusions_only: bool = False) -> list[Instruction]:
    """The instructions an instruction fuses or applies, nested fusions included; with
    `fusions_only`, those of fused computations alone (not a reduction's or a scatter's
    combining region, which XLA clones from wherever it first met one)."""
    calls = lambda i: i.calls if not fusions_only or i.opcode == "fusion" else ()  # noqa: E731
    out, stack, seen = [], list(calls(instr)), set()
    while stack:
        comp = stack.pop(0)
        if comp in seen or comp not in module.computations:
            continue
        seen.add(comp)
        out += module.computations[comp]
        stack.extend(c for inner in module.computations[comp] for c in calls(inner))
    return out


def instruction_layer(module: HloModule, instr: Instruction) -> str:
    """The layer of an instruction's work: for a fusion, the most common layer among the
    op_names of the instructions it fuses (nested fusions included; the first on ties),
    counting only its matmuls where it has any (they are where its time goes), else its
    own op_name's; OUTSIDE where none names one."""
    counts: Counter[str] = Counter()
    heavy: Counter[str] = Counter()
    for inner in _fused(module, instr):
        if (layer := op_layer(inner.op_name)) is not None:
            counts[layer] += 1
            heavy[layer] += inner.opcode in HEAVY_OPS
    counts = +heavy or counts  # unary + drops zero counts
    if counts:
        return counts.most_common(1)[0][0]  # Counter keeps first-seen order among equals
    return op_layer(instr.op_name) or OUTSIDE


# Primitives that only relabel or replicate data; a kernel's description leaves them out.
PLUMBING = frozenset({"broadcast_in_dim", "reshape", "squeeze", "expand_dims"})


def instruction_ops(module: HloModule, instr: Instruction) -> tuple[frozenset[str], frozenset[str]]:
    """What an instruction computes, from the op_names XLA kept: the JAX primitives (each
    op_name's last part) of the instructions it fuses, or its own for a library call, less
    `PLUMBING`; and whether they come from the forward or, under autodiff's ``transpose``,
    the backward. XLA's kernel names say only a fusion's root op (``loop_multiply_fusion``)."""
    inner = [i for i in _fused(module, instr, fusions_only=True) if i.op_name] or ([instr] if instr.op_name else [])
    prims = set()
    for i in inner:
        prim = scope_path(i.op_name.rsplit("/", 1)[-1])  # the last part, its wrappers peeled
        # a matmul's name also labels the converts and bitcasts of its output that XLA fused
        # elsewhere; an output's position (``vjp[1][29]``) is no primitive
        if "[" not in prim and (prim != "dot_general" or i.opcode in HEAVY_OPS):
            prims.add(prim)
    dirs = {"backward" if "transpose(" in i.op_name else "forward" for i in inner}
    return frozenset(prims - PLUMBING), frozenset(dirs)


def kernel_name(hlo_name: str) -> str:
    """The name XLA gives a fusion's kernel: the instruction's name with '.' and '-' as '_'."""
    return re.sub(r"[.\-]", "_", hlo_name)


def schedule(module: HloModule) -> list[ScheduleItem]:
    """The GPU-launching instructions of the entry computation in execution order."""
    if not module.scheduled:
        raise ValueError(f"HLO module {module.name} is not scheduled: pass the optimized HLO after compilation")
    items: list[ScheduleItem] = []

    def walk(comp: str) -> None:
        for instr in module.computations.get(comp, []):
            if instr.opcode in SILENT_OPS or instr.opcode.endswith("-done") or instr.opcode.endswith("-update"):
                continue
            if instr.opcode in INLINED_OPS:
                for called in instr.calls:
                    walk(called)
                continue
            layer, (prims, dirs) = instruction_layer(module, instr), instruction_ops(module, instr)
            kind = ("anchor" if instr.opcode == "fusion" and not instr.library
                    else "copy" if instr.opcode in COPY_OPS else "call")
            items.append(ScheduleItem(instr, kind, layer, primitives=prims, directions=dirs))

    walk(module.entry)
    return _with_kernel_names(module, items)


def _with_kernel_names(module: HloModule, items: list[ScheduleItem]) -> list[ScheduleItem]:
    """Each anchor with the names its kernel may bear. XLA compiles identical fusions once and
    names the kernel after the first of them it emits, which need not be the instruction's
    ``deduplicated_name``: any name of its class (the instructions deduplicated to one name,
    and that name's own instruction) may appear. Fusions without one (wrapped transposes,
    converts) are reused all the same within their family (same name without its numeric
    suffix, same fusion kind)."""
    anchors = [it.instruction for it in items if it.kind == "anchor"]
    targets = {i.deduplicated_name for i in anchors if i.deduplicated_name}

    def key(instr: Instruction) -> tuple:
        if instr.deduplicated_name or instr.name in targets:
            return "dedup", instr.deduplicated_name or instr.name
        body = module.bodies.get(instr.calls[0]) if instr.calls else None
        return ("body", body, instr.fusion_kind) if body else ("name", instr.name)

    classes: dict[tuple, set[str]] = {}
    for instr in anchors:
        classes.setdefault(key(instr), set()).update(kernel_name(n) for n in (instr.name, instr.deduplicated_name) if n)
    return [dataclasses.replace(it, kernel_names=frozenset(classes[key(it.instruction)]))
            if it.kind == "anchor" else it for it in items]


@dataclass
class PhaseJoin:
    """One phase instance's kernels, labelled: `labels[i]` is kernel i's layer, `how[i]`
    says how it was joined (HOW_ANCHOR, HOW_GAP; HOW_NONE unjoined, HOW_IGNORED not
    computation: autotuning, memset), `item[i]` its schedule item (-1: none)."""

    labels: list[str]
    how: np.ndarray
    item: np.ndarray


def _strip_suffix(name: str) -> str:
    return re.sub(r"_\d+$", "", name)


def _positional(names: Sequence[str], kinds: Sequence[int], items: Sequence[ScheduleItem]) -> PhaseJoin | None:
    """One kernel per schedule item, in order (a phase run on one stream), when the counts
    agree and nearly every fusion's kernel bears a name of its reuse group; an item whose
    kernel does not stays unjoined. None when the sequence does not line up."""
    if len(names) != len(items) or not items:
        return None
    fused = [i for i, it in enumerate(items) if it.kind == "anchor"]
    agree = np.array([kinds[i] == KERNEL and names[i] in items[i].kernel_names for i in fused], bool)
    if fused and agree.mean() < POSITIONAL_AGREEMENT:
        return None
    how = np.array([HOW_GAP if it.kind != "anchor" else HOW_ANCHOR for it in items], np.int8)
    how[np.array(fused, np.int64)[~agree]] = HOW_NONE
    how[np.array([k == MEMSET or is_autotuning(n) for n, k in zip(names, kinds)], bool)] = HOW_IGNORED
    joined = (how == HOW_ANCHOR) | (how == HOW_GAP)
    return PhaseJoin([it.layer if ok else OUTSIDE for it, ok in zip(items, joined)], how,
                     np.where(joined, np.arange(len(items)), -1))


def join_kernels(names: Sequence[str], kinds: Sequence[int], items: Sequence[ScheduleItem]) -> PhaseJoin:
    """Label one phase instance's kernels (`names`, `kinds` as KernelTable.kind, in start
    order) from the schedule `items` of the module that ran them: position by position
    where the sequence lines up (`_positional`), else by aligning kernel names with the
    schedule's fusions (`harness.trace.analyses.seq_align`)."""
    if (exact := _positional(names, kinds, items)) is not None:
        return exact
    n = len(names)
    how, item = np.full(n, HOW_NONE, np.int8), np.full(n, -1, np.int64)
    anchors = np.array([i for i, it in enumerate(items) if it.kind == "anchor"], np.int64)
    posting: dict[str, list[int]] = {}
    for a, i in enumerate(anchors):
        for name in items[i].kernel_names:
            posting.setdefault(name, []).append(a)
    ks, accepts = [], []  # the kernels that bear an anchor's name, and the anchors accepting each
    for k in range(n):
        if kinds[k] == MEMSET or is_autotuning(names[k]):
            how[k] = HOW_IGNORED
        elif kinds[k] == KERNEL and (own := posting.get(names[k], posting.get(_strip_suffix(names[k])))):
            ks.append(k)
            accepts.append(np.array(own, np.int64))
    layer_of = np.unique([items[i].layer for i in anchors] or [""], return_inverse=True)[1]
    matched = align(accepts, len(anchors), layer_of)
    how[np.array(ks, np.int64)[matched >= 0]] = HOW_ANCHOR
    item[np.array(ks, np.int64)[matched >= 0]] = anchors[matched[matched >= 0]]
    _fill_gaps(names, kinds, items, frozenset(posting), how, item)
    for k, a in zip(ks, repair(accepts, matched, len(anchors), layer_of)):
        if a >= 0 and how[k] == HOW_NONE:
            how[k], item[k] = HOW_ANCHOR, anchors[a]
    labels = [items[i].layer if i >= 0 else OUTSIDE for i in item]
    return PhaseJoin(labels, how, item)


def _fill_gaps(names: Sequence[str], kinds: Sequence[int], items: Sequence[ScheduleItem], anchor_names: frozenset,
               how: np.ndarray, item: np.ndarray) -> None:
    """Give the kernels between two matched anchors to the gap items between them, where
    unambiguous: memcpys to copies, other kernels to calls; one kernel per item in order,
    or, where the counts differ (a library call may launch several kernels), all to the
    items of one layer."""
    matched = np.flatnonzero(how == HOW_ANCHOR)
    bounds = [-1, *matched.tolist(), len(names)]
    for left, right in zip(bounds[:-1], bounds[1:]):
        lo = item[left] + 1 if left >= 0 else 0
        hi = item[right] if right < len(names) else len(items)
        between = [k for k in range(left + 1, right) if how[k] == HOW_NONE
                   and names[k] not in anchor_names and _strip_suffix(names[k]) not in anchor_names]
        for kind, item_kind in ((MEMCPY, "copy"), (KERNEL, "call")):
            ks = [k for k in between if kinds[k] == kind]
            cands = [i for i in range(lo, hi) if items[i].kind == item_kind]
            if not ks or not cands:
                continue
            if len(ks) == len(cands):
                chosen = cands
            elif len({items[i].layer for i in cands}) == 1:
                chosen = [cands[0]] * len(ks)
            else:
                continue
            for k, i in zip(ks, chosen):
                how[k], item[k] = HOW_GAP, i


@dataclass
class LayerJoin:
    """Every kernel of a profile labelled with its layer (OUTSIDE where none or unjoined),
    and per phase the share of its GPU time the join labelled (`coverage`) and the share
    that is not computation (`ignored`: autotuning, memsets)."""

    labels: np.ndarray  # object array, one label per kernel of the KernelTable
    coverage: dict[str, float]
    ignored: dict[str, float]
    ops: dict[str, str] = dataclasses.field(default_factory=dict)  # kernel name -> what it computes (`describe`)


def kernels_in(table: KernelTable, r: Range) -> np.ndarray:
    """Indices of the kernels that ran inside range `r`, in start order (the harness ends
    every phase with a device synchronization, so its GPU work runs inside its range)."""
    lo, hi = np.searchsorted(table.start, r.start, "left"), np.searchsorted(table.start, r.end, "right")
    return np.arange(lo, hi)[table.end[lo:hi] <= r.end]


def label_kernels(table: KernelTable, phase_ranges: Mapping[str, Sequence[Range]],
                  schedules: Mapping[str, Sequence[ScheduleItem]]) -> LayerJoin:
    """Join each phase instance's kernels to its phase's schedule (`schedules[phase]`)."""
    labels = np.full(len(table), OUTSIDE, dtype=object)
    coverage, ignored, dur = {}, {}, table.duration
    items_of: dict[str, set[tuple[str, int]]] = {}  # kernel name -> the schedule items it ran as
    for phase, ranges in phase_ranges.items():
        if phase not in schedules:
            raise ValueError(f"no optimized HLO for phase {phase!r}: have {', '.join(sorted(schedules)) or 'none'}")
        total = joined = skipped = 0
        for r in ranges:
            idx = kernels_in(table, r)
            names = [table.name_of(i) for i in idx]
            join = join_kernels(names, table.kind[idx], schedules[phase])
            labels[idx] = join.labels
            for name, i in zip(names, join.item.tolist()):
                if i >= 0:
                    items_of.setdefault(name, set()).add((phase, i))
            total += int(dur[idx].sum())
            joined += int(dur[idx][(join.how == HOW_ANCHOR) | (join.how == HOW_GAP)].sum())
            skipped += int(dur[idx][join.how == HOW_IGNORED].sum())
        coverage[phase] = joined / total if total else 0.0
        ignored[phase] = skipped / total if total else 0.0
    ops = {name: text for name, found in items_of.items()
           if (text := describe([schedules[phase][i] for phase, i in sorted(found)]))}
    return LayerJoin(labels, coverage, ignored, ops)


def describe(items: Sequence[ScheduleItem], most: int = 5) -> str:
    """One kernel's work, from the schedule items it ran as (a reused kernel runs for several
    layers, and may serve the forward and the backward alike): the sub-modules
    (``ffn``, ``attn``, ``lm_head``...), the directions, and the primitives, the most
    frequent first, ``ffn (forward): add, div, exp, mul, neg, ...`` (silu times the gate, XLA
    having expanded the sigmoid); "" where the HLO named none."""
    prims: Counter[str] = Counter(p for it in items for p in it.primitives)
    if not prims:
        return ""
    where = sorted({it.layer.split(".", 2)[2] if it.layer.startswith("layers.") else it.layer
                    for it in items if it.layer != OUTSIDE})
    dirs = [d for d in ("forward", "backward") if any(d in it.directions for it in items)]
    ranked = sorted(prims, key=lambda p: (-prims[p], p))
    listed = ", ".join(ranked[:most]) + (", ..." if len(ranked) > most else "")
    return f"{'+'.join(where) + ' ' if where else ''}({', '.join(dirs)}): {listed}"



def load_schedules(directory: str | Path) -> dict[str, list[ScheduleItem]]:
    """The schedule of every ``<phase>.txt`` in an HLO folder written by the JAX session
    (`harness.trace.sources.hlo.read_hlo_dir`)."""
    return {phase: schedule(module) for phase, module in read_hlo_dir(directory).items()}
