"""Kernel breakdown of a profile: which kernels ran in which phase, per measured step.

Attribution
-----------
Every kernel gets its innermost range, by execution interval or by launch call
(`harness.trace.analyses.attribution` says when each is sound); a range holds the kernels of its
own and of the ranges nested in it, so a phase's time is inclusive (``forward`` counts
the kernels of ``attn_scores`` nested in it).  ``--attribution auto`` picks execution
when the ranges end in synchronizations, i.e. when no more than `attribution.OUTSIDE_WARN_SHARE` of
the kernel time launched inside ranges runs outside every range or in another range
than it was launched in, and launch otherwise (where the profile records launches).

Steps
-----
Kernels are grouped under their root: the innermost step range (``fused_step`` inside
``step``, else ``step``) holding them; in a profile without step ranges, their outermost
range.  The figures of one range name are per step: its totals divided by the number of
steady root instances holding a range of that name (a range repeated per layer sums
over the layers of a step).  Steady instances: those outside ``warmup`` ranges; where the
profile has no ``warmup`` range and a root repeats (six ``train_step`` ranges), all but
the first, which carries compilation, allocation and autotuning and is reported apart,
unless its name numbers it past 1 (``ProfilerStep#2`` of a torch.profiler schedule: the
program's first steps were not recorded). Ranges whose names differ only by a number
(``step0`` ... ``step7``, `harness.trace.profile.numbered_instances`) are instances of
one range; torch.profiler's ``ProfilerStep#N`` are steps like ``step``.
Kernel names that ran only in the first steady instance of a root that repeats (XLA's
autotuning candidates, one-off initialisation) are kept out of the per-step figures too,
unless that instance is numbered past 1.
XLA autotuner kernels are never computation: they are reported apart, wherever they ran.
A profile without any range gets one pseudo-phase, the whole profile.  GPU time is the
sum of kernel durations (overlap on several streams counts twice), "busy" time the union
of their intervals over streams, "range" time the wall time of the ranges.  One process
driving N devices (JAX data-parallel) is N device timelines: GPU figures are per device.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from harness.trace.analyses import attribution as attr
from harness.trace.analyses.answers import answers, attention_flops, harness_metadata, run_json_problems
from harness.trace.analyses.hlo_join import hlo_dir, label_kernels, load_schedules
from harness.trace.analyses.intervals import device_timelines
from harness.trace.analyses.layers import LAYER_RANGE_PREFIX, layer_labels, layer_totals, measured_layer_phases
from harness.trace.kernels import PHASE_RULES, Category, classify, decode_gemm, short_name
from harness.trace.profile import (
    ATTENTION_RANGES,
    KERNEL,
    MEMCPY,
    MEMSET,
    PHASES,
    STEP_RANGES,
    WARMUP,
    KernelTable,
    Profile,
    ProfileError,
    Range,
    numbered_instances,
    open_profiler_step,
)
from harness.trace.sources.load import load_profile
from harness.trace.stats import Breakdown, Bucket, KernelStat, PhaseStats

__all__ = ["Breakdown", "Bucket", "KernelStat", "PhaseStats", "answers", "attention_flops", "breakdown",
           "breakdown_files", "harness_metadata", "load_profile"]

UNCLASSIFIED_WARN_SHARE = 0.05  # an "other" share above this gets a warning
TOP_N = 10
ATTRIBUTIONS = ("auto", "execution", "launch")
WHOLE_PROFILE = "(whole profile)"
_CATS = list(Category)
_CAT = {c: i for i, c in enumerate(_CATS)}


@lru_cache(maxsize=65536)
def _decode(name: str):
    return decode_gemm(name)


def _bucket(kt: KernelTable, mask: np.ndarray, inner: np.ndarray, ranges: Sequence[Range]) -> Bucket:
    """The kernels of `mask`, with their time per innermost range name and their top names."""
    idx = np.flatnonzero(mask)
    if not len(idx):
        return Bucket()
    dur = kt.duration[idx]
    where: dict[str, int] = defaultdict(int)
    uniq, inv = np.unique(inner[idx], return_inverse=True)
    for r, ns in zip(uniq, np.bincount(inv, weights=dur)):
        where[ranges[r].name if r >= 0 else "(no range)"] += int(ns)
    names, ninv = np.unique(kt.name[idx], return_inverse=True)
    top = [kt.names[names[i]] for i in np.argsort(-np.bincount(ninv, weights=dur))[:5]]
    return Bucket(count=len(idx), ns=int(dur.sum()), ranges=dict(where), names=top)


def _range_info(ranges: Sequence[Range], parents: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per range: inside a warm-up range, its root (-1: none), its PHASE_RULES bits."""
    n = len(ranges)
    warm, root, bits = np.zeros(n, bool), np.full(n, -1, np.int64), np.zeros(n, np.int64)
    has_steps = any(r.name in STEP_RANGES for r in ranges)
    for i, r in enumerate(ranges):
        p = parents[i]
        warm[i] = r.name == WARMUP or (p >= 0 and warm[p])
        if has_steps:
            root[i] = i if r.name in STEP_RANGES else (root[p] if p >= 0 else -1)
        else:
            root[i] = root[p] if p >= 0 else i
        own = sum(1 << j for j, (name, _, _) in enumerate(PHASE_RULES) if r.name == name)
        bits[i] = (bits[p] if p >= 0 else 0) | own
    return warm, root, bits


def _steady(ranges: Sequence[Range], warm: np.ndarray, root: np.ndarray) -> tuple[dict[str, list[int]], set[int],
                                                                                   str, list[str]]:
    """Steady root instances per root name, the first instances set apart, the rule in words."""
    instances: dict[str, list[int]] = defaultdict(list)
    for i in sorted({int(root[i]) for i in range(len(ranges)) if root[i] >= 0 and not warm[root[i]]},
                    key=lambda i: ranges[i].start):
        instances[ranges[i].name].append(i)
    first: set[int] = set()
    if warm.any():
        return instances, first, "kernels inside `warmup` ranges are left out", []
    rules, warnings = [], []
    for name, insts in instances.items():
        number = ranges[insts[0]].number
        if len(insts) >= 2 and number is not None and number > 1:
            rules.append(f"the first `{name}` range recorded is number {number}, not the program's first step: "
                         f"all {len(insts)} are measured")
        elif len(insts) >= 2:
            first.add(insts[0])
            rules.append(f"the first of {len(insts)} `{name}` ranges (compilation, allocation, autotuning) is "
                         f"reported apart as the first step; per-step figures are over the other {len(insts) - 1}")
        elif number is None or number <= 1:
            warnings.append(f"one `{name}` range and no `warmup` range: its figures include first-step costs "
                            "(compilation, allocation, autotuning); profile several steps")
    for name in instances:
        instances[name] = [i for i in instances[name] if i not in first]
    return instances, first, "no `warmup` range: " + "; ".join(rules) if rules else "no `warmup` range", warnings


def _categories(kt: KernelTable, inner: np.ndarray, bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Category index per kernel (by name, then PHASE_RULES) and the rule that set it (-1: the name)."""
    base = np.array([_CAT[classify(n)] for n in kt.names], np.int8)[kt.name]
    cats, rule = base.copy(), np.full(len(kt), -1, np.int8)
    kbits = np.where(inner >= 0, bits[np.maximum(inner, 0)], 0)
    for j in reversed(range(len(PHASE_RULES))):  # the first rule that applies wins
        _, by_name, new = PHASE_RULES[j]
        hit = ((kbits >> j) & 1).astype(bool) & np.isin(base, [_CAT[c] for c in by_name])
        cats[hit], rule[hit] = _CAT[new], j
    return cats, rule


def _phase(key: str, root: str, kt: KernelTable, k: np.ndarray, inst: np.ndarray, cats: np.ndarray,
           rule: np.ndarray, instances: list[int], walls: dict[int, int], occurrences: int) -> PhaseStats:
    """Statistics of one phase from its kernels `k` and their root instance `inst`, per device."""
    devs, busy, hidden = device_timelines(kt, k, cats[k] == _CAT[Category.COMMUNICATION])
    n = max(len(instances), 1) * devs
    dur = kt.duration[k].astype(np.float64)
    total = dur.sum() / n
    u, inv = np.unique(inst, return_inverse=True)
    per_inst = dict(zip(u.tolist(), (np.bincount(inv, weights=dur) / devs).tolist()))
    by_cat = np.bincount(cats[k], weights=dur, minlength=len(_CATS)) / n
    categories = {_CATS[c].value: float(by_cat[c]) for c in np.argsort(-by_cat, kind="stable") if by_cat[c]}
    # one row per (name, category, deciding rule): a name can sit both inside and outside attn_softmax
    key3 = (kt.name[k].astype(np.int64) * len(_CATS) + cats[k]) * (len(PHASE_RULES) + 1) + rule[k] + 1
    u, inv = np.unique(key3, return_inverse=True)
    ns, calls = np.bincount(inv, weights=dur), np.bincount(inv)
    stats = []
    for j in np.argsort(-ns, kind="stable"):
        rest, rule_j = divmod(int(u[j]), len(PHASE_RULES) + 1)
        name_id, cat = divmod(rest, len(_CATS))
        stats.append(KernelStat(name=(name := kt.names[name_id]), category=_CATS[cat].value,
                                calls_per_step=calls[j] / n, ns_per_step=ns[j] / n, mean_ns=ns[j] / calls[j],
                                share=ns[j] / n / total if total else 0.0, gemm=_decode(name),
                                inferred_from=PHASE_RULES[rule_j - 1][0] if rule_j else None))
    kinds, median = kt.kind[k], (lambda per: float(statistics.median([per.get(i, 0) for i in instances] or [0])))
    return PhaseStats(phase=key, root=root, steps=len(instances), occurrences=occurrences,
                      range_ns_per_step=sum(walls.values()) * devs / n, gpu_ns_per_step=float(total),
                      kernels_per_step=float(np.count_nonzero(kinds == KERNEL)) / n, categories=categories,
                      kernels=stats, copies_per_step=float(np.count_nonzero((kinds == MEMCPY) | (kinds == MEMSET))) / n,
                      gpu_ns_median=median(per_inst), range_ns_median=median(walls), devices=devs,
                      busy_ns_per_step=busy / n, hidden_communication_ns_per_step=hidden / n)


def program_ranges(profile: Profile) -> tuple[list[Range], str, str]:
    """The profile's ranges as the breakdown reads them: layer ranges left out (they label
    kernels, `harness.trace.analyses.layers`), numbered ranges as instances of one range,
    torch.profiler's last ProfilerStep dropped where it closed mid-iteration; with the two
    rules applied, in words ("" where none)."""
    ranges, numbered = numbered_instances([r for r in profile.ranges if not r.name.startswith(LAYER_RANGE_PREFIX)])
    ranges, unclosed = open_profiler_step(ranges)
    return ranges, numbered, unclosed


def kernel_steps(kt: KernelTable, ranges: Sequence[Range], inner: np.ndarray, root: np.ndarray, warm: np.ndarray,
                 first: set[int], instances: Mapping[str, list[int]], tune: np.ndarray) -> dict[str, np.ndarray]:
    """Per kernel (boolean arrays, `kroot` its root range instance, -1 for none), from its
    innermost range `inner`: `warm` (in a warm-up range), `first` (in a first step set
    apart), `none` (in no range, or outside every root range), `only_first` (a name that ran
    only in the first steady instance of its root: setup, no per-step work, unless the
    profile began past the program's first steps, ProfilerStep#550) and `measured` (what the
    per-step figures count). `tune`: the autotuner's kernels, none of these."""
    safe = np.maximum(inner, 0)
    kroot = np.where(inner >= 0, root[safe], -1)
    kwarm = (inner >= 0) & warm[safe]
    kfirst = (kroot >= 0) & np.isin(kroot, list(first))
    none = ~tune & ((inner < 0) | (~kwarm & (kroot < 0)))
    measured = ~tune & ~none & ~kwarm & ~kfirst
    only_first = np.zeros(len(kt), bool)
    for insts in instances.values():
        if len(insts) >= 2 and (ranges[insts[0]].number or 0) <= 1:
            head = measured & (kroot == insts[0])
            later = kt.name[measured & np.isin(kroot, insts[1:])]
            only_first |= head & ~np.isin(kt.name, later)
    return {"kroot": kroot, "warm": kwarm, "first": kfirst, "none": none, "only_first": only_first,
            "measured": measured & ~only_first}


@dataclass
class Selection:
    """Which kernels a profile's per-step figures count, and why (`select`)."""

    ranges: list[Range]  # as the breakdown reads them (`program_ranges`)
    parents: np.ndarray  # per range: the innermost range holding it (-1: none)
    root: np.ndarray  # per range: its root (step) range (-1: none)
    warm: np.ndarray  # per range: inside a warm-up range
    bits: np.ndarray  # per range: its PHASE_RULES bits
    first: set[int]  # root ranges set apart as the first step
    instances: dict[str, list[int]]  # per root name: its steady (measured) instances
    inner: np.ndarray  # per kernel: its innermost range by the chosen attribution (-1: none)
    cats: np.ndarray  # per kernel: category index
    rule: np.ndarray  # per kernel: the PHASE_RULES index that set its category (-1: its name)
    tune: np.ndarray  # per kernel: an autotuner's
    kernels: dict[str, np.ndarray]  # `kernel_steps`: kroot, warm, first, none, only_first, measured
    mode: str  # "execution" or "launch"
    reason: str
    outside: float
    moved: float | None
    steady_rule: str
    warnings: list[str]

    def measured_steps(self) -> list[Range]:
        """The measured step ranges (steady step instances) and every range inside one."""
        keep = {i for insts in self.instances.values() for i in insts if self.ranges[i].name in STEP_RANGES}
        return [r for i, r in enumerate(self.ranges) if self.root[i] in keep and not self.warm[i]]


def select(profile: Profile, attribution: str = "auto") -> Selection | None:
    """Attribute `profile`'s kernels to its ranges and mark those the per-step figures count
    (module docstring): by execution or by launch (`attribution`, "auto" choosing), the
    steady step instances, the first step set apart. None for a profile without ranges.
    The breakdown and every analysis that must count the same kernels (communication
    hidden under compute, collectives aligned across ranks) start here."""
    if attribution not in ATTRIBUTIONS:
        raise ProfileError(f"--attribution {attribution!r}: choose one of {', '.join(ATTRIBUTIONS)}")
    kt = profile.kernels
    ranges, numbered, unclosed = program_ranges(profile)
    if not ranges:
        return None
    parents = attr.range_parents(ranges)
    by_exec = attr.by_execution(kt, ranges)
    launches = attr.has_launches(kt)
    by_launch = attr.by_launch(kt, ranges) if launches else None
    warm, root, bits = _range_info(ranges, parents)
    cats, rule = _categories(kt, by_exec, bits)
    tune = cats == _CAT[Category.AUTOTUNING]
    outside, moved = attr.spill(np.where(tune, 0, kt.duration), by_exec, by_launch, ranges, kt)
    mode, reason = attr.choose(attribution, outside, moved, launches)
    # by launch, an activity whose launch is not in the profile belongs to no range: it was
    # asked for before the profile began (the previous step's tail), whenever it ran
    inner = by_exec if by_launch is None or mode == "execution" else by_launch
    cats, rule = _categories(kt, inner, bits)
    instances, first, steady_rule, warnings = _steady(ranges, warm, root)
    steady_rule = "; ".join(filter(None, (numbered, unclosed, steady_rule)))
    k = kernel_steps(kt, ranges, inner, root, warm, first, instances, tune)
    return Selection(ranges, parents, root, warm, bits, first, dict(instances), inner, cats, rule, tune, k, mode,
                     reason, outside, moved, steady_rule, warnings)


def breakdown(profile: Profile, require: Iterable[str] = (), attribution: str = "auto",
              labels: np.ndarray | None = None, schedules: Mapping | None = None) -> Breakdown:
    """Attribute `profile`'s kernels to phases (see module docstring) and summarise them.

    `require` names ranges that must appear (e.g. ``("forward",)``); a missing one raises
    `ProfileError`.  `attribution`: "auto", "execution" or "launch".  Layer ranges
    (``layer:...``) are no phases: they give each kernel its layer (`harness.trace.analyses.layers`),
    and the breakdown's `layers` holds the forward's and backward's time per layer;
    `labels` gives the per-kernel layers instead; `schedules` (phase -> the optimized HLO's
    schedule, `harness.trace.analyses.hlo_join`) labels JAX's kernels through XLA's metadata.
    """
    sel = select(profile, attribution)
    kt = profile.kernels
    if labels is None and any(r.name.startswith(LAYER_RANGE_PREFIX) for r in profile.ranges):
        labels = layer_labels(kt, profile.ranges)
    names = {r.name for r in sel.ranges} if sel else set()
    missing = [n for n in require if n not in names]
    if missing:
        found = ", ".join(sorted(names)) or "none"
        raise ProfileError(f"{profile.path}: no range named {', '.join(map(repr, missing))}; ranges found: {found}")
    if sel is None:
        return _whole_profile(profile)
    ranges, parents, root, warm, first = sel.ranges, sel.parents, sel.root, sel.warm, sel.first
    inner, cats, rule, tune, k = sel.inner, sel.cats, sel.rule, sel.tune, sel.kernels
    mode, reason, outside, moved, warnings = sel.mode, sel.reason, sel.outside, sel.moved, list(sel.warnings)
    steady_rule = sel.steady_rule
    kroot, kwarm, kfirst, none, only_first, measured = (k[key] for key in ("kroot", "warm", "first", "none",
                                                                            "only_first", "measured"))
    phases = _phases(ranges, parents, root, warm, first, kt, np.flatnonzero(measured), inner, kroot, cats, rule)
    if not phases:
        raise ProfileError(f"{profile.path}: no kernel ran inside a measured range (ranges: "
                           f"{', '.join(sorted(names))}); were the kernels recorded on the same clock?")
    if outside > attr.OUTSIDE_WARN_SHARE:
        warnings.append(f"{outside:.1%} of the kernel time launched inside ranges ran outside every range "
                        "(the program does not synchronize at range ends); tables attribute by "
                        f"{'launch' if mode == 'launch' else 'execution interval (--attribution execution)'}")
    bucket = lambda mask: _bucket(kt, mask, inner, ranges)  # noqa: E731
    layer_ranges, notes = measured_layer_phases(ranges, root, warm, first), list(profile.notes)
    if schedules is not None and labels is None:
        join = label_kernels(kt, layer_ranges, schedules)
        labels = join.labels
        notes.append("layers from XLA's optimized HLO joined to the kernels: " + ", ".join(
            f"{p} {c:.1%} of GPU time" for p, c in join.coverage.items()) + " labelled")
        warnings += [f"the layer join covers only {c:.1%} of the {p} GPU time" for p, c in join.coverage.items()
                     if c < 0.95]
    layers = {} if labels is None else layer_totals(kt, layer_ranges, labels)
    return Breakdown(label=profile.label, source=profile.source, path=profile.path, phases=phases,
                     warmup=bucket(kwarm & ~tune), autotuning=bucket(tune), unattributed=bucket(none),
                     warnings=[*warnings, *_warnings(phases, profile.cpu_ops)], notes=notes,
                     first_step=bucket(kfirst & ~tune & ~none & ~kwarm), first_only=bucket(only_first),
                     attribution=mode, attribution_reason=reason, outside_share=outside, moved_share=moved,
                     steady_rule=steady_rule, api=list(profile.api), layers=layers, cpu_ops=profile.cpu_ops)


def _phases(ranges: Sequence[Range], parents: np.ndarray, root: np.ndarray, warm: np.ndarray, first: set[int],
            kt: KernelTable, m: np.ndarray, inner: np.ndarray, kroot: np.ndarray, cats: np.ndarray,
            rule: np.ndarray) -> dict[str, PhaseStats]:
    """Per (root name, range name): the measured kernels `m` of the ranges of that name and
    of the ranges nested in them, up to the kernel's root (vectorized, one pass per level)."""
    keys: dict[tuple[str, str], int] = {}
    group = np.full(len(ranges), -1, np.int64)
    members: dict[int, list[int]] = defaultdict(list)
    for i, r in enumerate(ranges):
        if root[i] >= 0 and not warm[i] and root[i] not in first:
            group[i] = keys.setdefault((ranges[root[i]].name, r.name), len(keys))
            members[group[i]].append(i)
    gs, ks = [], []
    cur, stop, idx = inner[m], kroot[m], m
    while len(idx):
        g = group[cur]
        gs.append(g[g >= 0])
        ks.append(idx[g >= 0])
        on = (cur != stop) & (parents[cur] >= 0)
        cur, stop, idx = parents[cur][on], stop[on], idx[on]
    G, K = (np.concatenate(gs), np.concatenate(ks)) if gs else (np.empty(0, np.int64),) * 2
    order = np.argsort(G, kind="stable")
    G, K = G[order], K[order]
    bounds = np.searchsorted(G, np.arange(len(keys) + 1))
    phases: dict[str, PhaseStats] = {}
    one_root = len({rname for rname, _ in keys}) == 1  # a user's `train_step`: its phases keep their names
    for (rname, name), g in sorted(keys.items(), key=lambda kv: _phase_order(kv[0])):
        k = K[bounds[g]:bounds[g + 1]]
        if not len(k):
            continue
        walls: dict[int, int] = defaultdict(int)
        for i in members[g]:
            walls[int(root[i])] += ranges[i].end - ranges[i].start
        insts = sorted(walls, key=lambda i: ranges[i].start)
        key = name if one_root or rname in ("step", name) else f"{rname}/{name}"
        phases[key] = _phase(key, rname, kt, k, kroot[k], cats, rule, insts, walls, len(members[g]))
    return phases


def _whole_profile(profile: Profile) -> Breakdown:
    """No ranges at all: one pseudo-phase holding every kernel but the autotuner's."""
    kt = profile.kernels
    inner = np.full(len(kt), -1, np.int64)
    cats, rule = _categories(kt, inner, np.zeros(1, np.int64))
    tune = cats == _CAT[Category.AUTOTUNING]
    k = np.flatnonzero(~tune)
    whole = _phase(WHOLE_PROFILE, WHOLE_PROFILE, kt, k, np.zeros(len(k), np.int64), cats, rule, [0],
                   {0: int(kt.end.max() - kt.start.min())}, 0)
    note = ("no annotation ranges: the tables cover the whole profile (one \"step\"); add NVTX ranges "
            "(torch.cuda.nvtx.range_push/pop, jax.profiler.TraceAnnotation) around steps and phases "
            "for per-step figures")
    return Breakdown(label=profile.label, source=profile.source, path=profile.path, phases={WHOLE_PROFILE: whole},
                     warmup=Bucket(), autotuning=_bucket(kt, tune, inner, []), unattributed=Bucket(),
                     warnings=_warnings({WHOLE_PROFILE: whole}, profile.cpu_ops), notes=[note, *profile.notes],
                     attribution="none", attribution_reason="no ranges", steady_rule="no ranges: the whole profile",
                     api=list(profile.api), cpu_ops=profile.cpu_ops)


_ORDER = (*STEP_RANGES, *PHASES, *ATTENTION_RANGES)


def _phase_order(key: tuple[str, str]) -> tuple[int, int, int, str]:
    root, name = key
    rank = lambda n: _ORDER.index(n) if n in _ORDER else len(_ORDER)  # noqa: E731
    return (rank(root), 0 if name == root else 1, rank(name), name)


def _warnings(phases: dict[str, PhaseStats], cpu_ops: bool = False) -> list[str]:
    out = []
    for p in phases.values():
        share = p.share(Category.OTHER)
        if share >= UNCLASSIFIED_WARN_SHARE:
            top = [k for k in p.kernels if k.category == Category.OTHER.value][:5]
            listed = "; ".join(f"`{short_name(k.name, 80)}` {k.share:.1%}" for k in top)
            what = "CPU time in unclassified ops" if cpu_ops else "GPU time in unclassified kernels"
            out.append(f"{p.phase}: {share:.1%} of {what}, the top ones: {listed}; "
                       "add a pattern to harness.trace.kernels.PATTERNS")
    return out


def breakdown_files(paths: Sequence[str | Path], labels: Sequence[str | None] = (),
                    run_jsons: Sequence[str | Path] = (), require: Iterable[str] = (),
                    nsys_bin: str | None = None, attribution: str = "auto",
                    force: bool = False) -> tuple[list[Breakdown], list[dict]]:
    """Breakdowns of profiles and their answers; the i-th label and `harness.run` result
    JSON go with the i-th profile (fewer of them: the rest go without)."""
    require = tuple(require)
    bds, answer_sets = [], []
    for i, path in enumerate(paths):
        profile = load_profile(path, labels[i] if i < len(labels) else None, nsys_bin, force)
        hlo = hlo_dir(path)
        bd = breakdown(profile, require, attribution, schedules=load_schedules(hlo) if hlo.is_dir() else None)
        meta = harness_metadata(run_jsons[i]) if i < len(run_jsons) else {}
        bd.warnings += run_json_problems(profile, bd, meta) if meta else []
        bds.append(bd)
        answer_sets.append(answers(bd, meta.get("forward_ms"), meta))
    return bds, answer_sets
