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
Ranges a framework opens itself (``FSDP::*``, ``nccl:*``..., `harness.trace.library_ranges`)
are no phases and no steps: their kernels count in the phase that holds them, and
`Breakdown.library_ranges` lists them per phase (`harness.trace.analyses.library`).
A profile without any range of its own gets one pseudo-phase, the whole profile.  GPU time is the
sum of kernel durations (overlap on several streams counts twice), "busy" time the union
of their intervals over streams, "range" time the wall time of the ranges.  One process
driving N devices (JAX data-parallel) is N device timelines: GPU figures are per device.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

from harness.common.layer_names import LAYER_RANGE_PREFIX
from harness.trace.analyses import attribution as attr
from harness.trace.analyses.answers import answers, attention_flops, harness_metadata, run_json_problems
from harness.trace.analyses.hlo_join import hlo_dir, label_kernels, load_schedules
from harness.trace.analyses.intervals import device_timelines
from harness.trace.analyses.layers import layer_labels, layer_totals, measured_layer_phases
from harness.trace.analyses.library import holders, only_library, sub_ranges
from harness.trace.analyses.selection import _CAT, _CATS, Selection, _categories, program_ranges, select
from harness.trace.kernels import PHASE_RULES, Category, decode_gemm, short_name
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
)
from harness.trace.sources.load import load_profile
from harness.trace.stats import Breakdown, Bucket, KernelStat, PhaseStats

__all__ = ["Breakdown", "Bucket", "KernelStat", "PhaseStats", "answers", "attention_flops", "breakdown",
           "breakdown_files", "harness_metadata", "load_profile"]

UNCLASSIFIED_WARN_SHARE = 0.05  # an "other" share above this gets a warning
TOP_N = 10
WHOLE_PROFILE = "(whole profile)"


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


def _lead(kt: KernelTable, k: np.ndarray, inst: np.ndarray, starts: Mapping[int, int]) -> float:
    """Summed over root instances and devices: from the instance's first range of the phase to
    its first kernel on the device (never below zero)."""
    width = int(kt.device[k].max()) + 1
    u, inv = np.unique(inst * width + kt.device[k], return_inverse=True)
    first = np.full(len(u), np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first, inv, kt.start[k].astype(np.int64))
    return float(sum(max(int(f) - starts[int(i)], 0) for f, i in zip(first, u // width)))


def _phase(key: str, root: str, kt: KernelTable, k: np.ndarray, inst: np.ndarray, cats: np.ndarray,
           rule: np.ndarray, instances: list[int], walls: dict[int, int], occurrences: int,
           starts: Mapping[int, int] | None = None) -> PhaseStats:
    """Statistics of one phase from its kernels `k` and their root instance `inst`, per device;
    `starts`: per root instance, the start of its first range of the phase (None: no ranges)."""
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
                      busy_ns_per_step=busy / n, hidden_communication_ns_per_step=hidden / n,
                      lead_ns_per_step=_lead(kt, k, inst, starts) / n if starts is not None and len(k) else None)


def breakdown(profile: Profile, require: Iterable[str] = (), attribution: str = "auto",
              labels: np.ndarray | None = None, schedules: Mapping | None = None,
              selection: Selection | None = None) -> Breakdown:
    """Attribute `profile`'s kernels to phases (see module docstring) and summarise them.

    `require` names ranges that must appear (e.g. ``("forward",)``); a missing one raises
    `ProfileError`.  `attribution`: "auto", "execution" or "launch".  Layer ranges
    (``layer:...``) are no phases: they give each kernel its layer (`harness.trace.analyses.layers`),
    and the breakdown's `layers` holds the forward's and backward's time per layer;
    `labels` gives the per-kernel layers instead; `schedules` (phase -> the optimized HLO's
    schedule, `harness.trace.analyses.hlo_join`) labels JAX's kernels through XLA's metadata;
    `selection`, the profile's `select` made already (its attribution then wins), saves
    making it again.
    """
    sel = selection if selection is not None else select(profile, attribution)
    kt = profile.kernels
    if labels is None and any(r.name.startswith(LAYER_RANGE_PREFIX) for r in profile.ranges):
        labels = layer_labels(kt, profile.ranges)
    names = {r.name for r in [*sel.ranges, *sel.library]} if sel else set()
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
    phases, keys = _phases(ranges, parents, root, warm, first, kt, np.flatnonzero(measured), inner, kroot, cats, rule)
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
        for p in phases.values():
            for k in p.kernels:
                k.ops = join.ops.get(k.name)
        notes.append("layers from XLA's optimized HLO joined to the kernels: " + ", ".join(
            f"{p} {c:.1%} of GPU time" for p, c in join.coverage.items()) + " labelled")
        warnings += [f"the layer join covers only {c:.1%} of the {p} GPU time" for p, c in join.coverage.items()
                     if c < 0.95]
    layers = {} if labels is None else layer_totals(kt, layer_ranges, labels)
    library = sub_ranges(kt, sel.library, [keys[h] if h >= 0 else None for h in holders(ranges, sel.library)],
                         measured, mode, phases)
    if sel.library and all(r.name in (*STEP_RANGES, WARMUP) for r in ranges):
        steady_rule += "; " + only_library(sel.library, whole=False)
    return Breakdown(label=profile.label, source=profile.source, path=profile.path, phases=phases,
                     warmup=bucket(kwarm & ~tune), autotuning=bucket(tune), unattributed=bucket(none),
                     warnings=[*warnings, *_warnings(phases, profile.cpu_ops)], notes=notes,
                     first_step=bucket(kfirst & ~tune & ~none & ~kwarm), first_only=bucket(only_first),
                     attribution=mode, attribution_reason=reason, outside_share=outside, moved_share=moved,
                     steady_rule=steady_rule, api=list(profile.api), layers=layers, cpu_ops=profile.cpu_ops,
                     library_ranges=library)


def _phases(ranges: Sequence[Range], parents: np.ndarray, root: np.ndarray, warm: np.ndarray, first: set[int],
            kt: KernelTable, m: np.ndarray, inner: np.ndarray, kroot: np.ndarray, cats: np.ndarray,
            rule: np.ndarray) -> tuple[dict[str, PhaseStats], list[str | None]]:
    """Per (root name, range name): the measured kernels `m` of the ranges of that name and
    of the ranges nested in them, up to the kernel's root (vectorized, one pass per level);
    and per range, its phase's key (None: outside the measured steps)."""
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
    key_of: dict[int, str] = {}
    for (rname, name), g in sorted(keys.items(), key=lambda kv: _phase_order(kv[0])):
        key_of[g] = key = name if one_root or rname in ("step", name) else f"{rname}/{name}"
        k = K[bounds[g]:bounds[g + 1]]
        if not len(k):
            continue
        walls: dict[int, int] = defaultdict(int)
        starts: dict[int, int] = {}
        for i in members[g]:
            walls[int(root[i])] += ranges[i].end - ranges[i].start
            starts[int(root[i])] = min(starts.get(int(root[i]), ranges[i].start), ranges[i].start)
        insts = sorted(walls, key=lambda i: ranges[i].start)
        phases[key] = _phase(key, rname, kt, k, kroot[k], cats, rule, insts, walls, len(members[g]), starts)
    return phases, [key_of[int(g)] if g >= 0 else None for g in group]


def _whole_profile(profile: Profile) -> Breakdown:
    """No ranges of the program's own: one pseudo-phase holding every kernel but the
    autotuner's, with the library ranges, if any, as its sub-ranges."""
    kt = profile.kernels
    inner = np.full(len(kt), -1, np.int64)
    cats, rule = _categories(kt, inner, np.zeros(1, np.int64))
    tune = cats == _CAT[Category.AUTOTUNING]
    k = np.flatnonzero(~tune)
    whole = _phase(WHOLE_PROFILE, WHOLE_PROFILE, kt, k, np.zeros(len(k), np.int64), cats, rule, [0],
                   {0: int(kt.end.max() - kt.start.min())}, 0)
    library = program_ranges(profile)[3]
    own = " of the program's own" if library else ""
    note = (f"no annotation ranges{own}: the tables cover the whole profile (one \"step\"); add NVTX ranges "
            "(torch.cuda.nvtx.range_push/pop, jax.profiler.TraceAnnotation) around steps and phases "
            "for per-step figures")
    mode = "launch" if attr.has_launches(kt) else "execution"
    return Breakdown(label=profile.label, source=profile.source, path=profile.path, phases={WHOLE_PROFILE: whole},
                     warmup=Bucket(), autotuning=_bucket(kt, tune, inner, []), unattributed=Bucket(),
                     warnings=_warnings({WHOLE_PROFILE: whole}, profile.cpu_ops), notes=[note, *profile.notes],
                     attribution="none", attribution_reason=f"no ranges{own}",
                     steady_rule=only_library(library, whole=True) if library else "no ranges: the whole profile",
                     api=list(profile.api), cpu_ops=profile.cpu_ops,
                     library_ranges=sub_ranges(kt, library, [WHOLE_PROFILE] * len(library), ~tune, mode,
                                               {WHOLE_PROFILE: whole}))


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
