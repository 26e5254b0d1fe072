"""Kernel breakdown of a profile: which kernels ran in which phase, per measured step.

Attribution rule
----------------
A kernel belongs to every range whose ``[start, end]`` interval contains the kernel's
*execution* interval on the GPU; its phase is the innermost (shortest) such range.  A
phase's time is inclusive: ``forward`` counts the kernels of ``attn_scores`` nested in it.

Why execution intervals and not launching threads: PyTorch launches backward kernels
from its autograd thread, not from the thread that pushed the ``backward`` range, so
nsys's own projection of NVTX ranges onto the GPU (which follows the range's thread)
misses nearly all of them.  The harness synchronizes the device at the end of every
phase, so each phase's GPU work finishes inside its range and containment is sound.

When the rule misleads: work not synchronized at the range end (it spills into the
next range, or into none); several processes or streams whose kernels overlap a range
they do not belong to; ranges pushed by other threads that overlap in time (a kernel
then belongs to the shortest of them, whoever launched it).  A kernel straddling a
range boundary belongs to the enclosing range only.

Steps
-----
Kernels inside a ``warmup`` range are left out of every phase.  Measured kernels are
grouped under their root: the innermost step range (``fused_step`` inside ``step``, else
``step``) containing them; in a profile without step ranges, their outermost range.
Kernels outside every step range (e.g. a plain timing loop after the measured steps,
even inside attention ranges) are reported apart.  Per-step figures divide by the
number of root ranges that hold kernels (a JAX ``step`` that only wraps a ``fused_step``
is a fused step, not a split one).  XLA autotuner kernels are never computation: they are reported apart,
wherever they ran.  GPU time is the sum of kernel durations (overlap on several streams
counts twice); "range" time is the wall time of the ranges themselves.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.trace import framework_profile, nsys
from harness.trace.kernels import Category, GemmInfo, classify, decode_gemm
from harness.trace.profile import ATTENTION_RANGES, PHASES, STEP_RANGES, WARMUP, Kernel, Profile, ProfileError, Range

UNCLASSIFIED_WARN_SHARE = 0.05  # an "other" share above this gets a warning
NOTABLE_SHARE = 0.05  # answer (c): non-GEMM kernels at or above this share of forward
TOP_N = 10


@dataclass
class KernelStat:
    """One kernel name within a phase; per-step figures are means over measured steps."""

    name: str
    category: str
    calls_per_step: float
    ns_per_step: float
    mean_ns: float
    share: float  # of the phase's GPU time
    gemm: GemmInfo | None = None


@dataclass
class PhaseStats:
    """GPU work inside one range name, per measured step of its root."""

    phase: str  # the range name, or "root/name" where the root is not `step`
    root: str
    steps: int  # root ranges outside warm-up: the per-step divisor
    occurrences: int  # ranges of this name outside warm-up
    range_ns_per_step: float  # wall time of the ranges
    gpu_ns_per_step: float
    kernels_per_step: float
    categories: dict[str, float]  # category -> ns per step, every category present
    kernels: list[KernelStat]  # all kernel names, most time first

    def share(self, category: Category) -> float:
        return self.categories.get(category.value, 0.0) / self.gpu_ns_per_step if self.gpu_ns_per_step else 0.0


@dataclass
class Bucket:
    """Kernels kept out of the phases (warm-up, autotuning, outside every step)."""

    count: int = 0
    ns: int = 0
    ranges: dict[str, int] = field(default_factory=dict)  # innermost range -> ns


@dataclass
class Breakdown:
    label: str
    source: str
    path: str
    phases: dict[str, PhaseStats]
    warmup: Bucket
    autotuning: Bucket
    unattributed: Bucket
    warnings: list[str]
    notes: list[str]


def load_profile(path: str | Path, label: str | None = None, nsys_bin: str | None = None) -> Profile:
    """Load a profile by its file name: ``.nsys-rep`` (exported with nsys), ``.sqlite[.gz]``,
    a torch.profiler trace (``.json[.gz]``) or a JAX profiler trace (``.xplane.pb``)."""
    path = Path(path)
    name = path.name
    if not path.exists():
        raise ProfileError(f"{path}: no such file")
    if name.endswith(".nsys-rep"):
        return nsys.read_sqlite(nsys.export_sqlite(path, nsys_bin), label)
    if name.endswith((".sqlite", ".sqlite.gz")):
        return nsys.read_sqlite(path, label)
    if name.endswith((".json", ".json.gz")):
        return framework_profile.load_torch_trace(path, label)
    if name.endswith((".xplane.pb", ".xplane.pb.gz")) or path.is_dir():
        return framework_profile.load_jax_trace(path, label)
    raise ProfileError(f"{path}: not a profile; expected .nsys-rep, .sqlite[.gz] (nsys export), "
                       "a torch.profiler .json or a JAX .xplane.pb")


def _containing(kernels: list[Kernel], ranges: list[Range]) -> list[list[Range]]:
    """For each kernel (sorted by start), the ranges containing it, outermost first."""
    order = sorted(ranges, key=lambda r: r.start)
    active: list[Range] = []
    out, i = [], 0
    for k in kernels:
        while i < len(order) and order[i].start <= k.start:
            active.append(order[i])
            i += 1
        active = [r for r in active if r.end >= k.start]
        inside = [r for r in active if r.end >= k.end]
        out.append(sorted(inside, key=lambda r: (r.start - r.end, r.start)))
    return out


def _root_of(path: list[Range]) -> Range:
    """The innermost step range holding the kernel (the JAX harness wraps `fused_step` in
    a `step`), else its outermost range."""
    return next((r for r in reversed(path) if r.name in STEP_RANGES), path[0])


def _inside(r: Range, outer: Range) -> bool:
    return outer.start <= r.start and r.end <= outer.end


def _in_warmup(r: Range, warmups: list[Range]) -> bool:
    return any(_inside(r, w) for w in warmups)


def _kernel_stats(items: list[tuple[Kernel, str]], steps: int, total: float) -> list[KernelStat]:
    by_name: dict[str, list[int]] = defaultdict(list)
    cats: dict[str, str] = {}
    for k, cat in items:
        by_name[k.name].append(k.duration)
        cats.setdefault(k.name, cat)
    stats = [KernelStat(name, cats[name], len(d) / steps, sum(d) / steps, sum(d) / len(d),
                        sum(d) / steps / total if total else 0.0, decode_gemm(name))
             for name, d in by_name.items()]
    return sorted(stats, key=lambda s: -s.ns_per_step)


def _add(bucket: Bucket, k: Kernel, path: list[Range]) -> None:
    bucket.count += 1
    bucket.ns += k.duration
    where = path[-1].name if path else "(no range)"
    bucket.ranges[where] = bucket.ranges.get(where, 0) + k.duration


def breakdown(profile: Profile, require: Iterable[str] = ()) -> Breakdown:
    """Attribute `profile`'s kernels to phases (see module docstring) and summarise them.

    `require` names ranges that must appear (e.g. ``("forward",)``); a missing one, or a
    profile without ranges, raises `ProfileError`.
    """
    if not profile.ranges:
        raise ProfileError(f"{profile.path}: no annotation ranges; run the harness's profiling "
                           "mode (it emits warmup/step/forward/... ranges), and for JAX under "
                           "nsys keep the ranges out of the TSL domain")
    names = {r.name for r in profile.ranges}
    missing = [n for n in require if n not in names]
    if missing:
        raise ProfileError(f"{profile.path}: no range named {', '.join(map(repr, missing))}; "
                           f"ranges found: {', '.join(sorted(names))}")
    kernels = sorted(profile.kernels, key=lambda k: k.start)
    warmups = [r for r in profile.ranges if r.name == WARMUP]
    measured_ranges = [r for r in profile.ranges if r.name != WARMUP and not _in_warmup(r, warmups)]
    warm, tune, none = Bucket(), Bucket(), Bucket()
    groups: dict[tuple[str, str], list[tuple[Kernel, str]]] = defaultdict(list)
    roots: dict[str, set[Range]] = defaultdict(set)  # root name -> instances holding kernels
    has_steps = any(r.name in STEP_RANGES for r in profile.ranges)
    for k, path in zip(kernels, _containing(kernels, profile.ranges)):
        names_in = tuple(r.name for r in path)
        category = classify(k.name, names_in)
        if category is Category.AUTOTUNING:
            _add(tune, k, path)
        elif not path or (has_steps and WARMUP not in names_in and not set(names_in) & set(STEP_RANGES)):
            _add(none, k, path)
        elif WARMUP in names_in:
            _add(warm, k, path)
        else:
            root = _root_of(path)
            roots[root.name].add(root)
            for r in path[path.index(root):]:
                groups[(root.name, r.name)].append((k, category.value))
    phases: dict[str, PhaseStats] = {}
    for (root, name), items in sorted(groups.items(), key=lambda kv: _phase_order(kv[0])):
        n = len(roots[root])
        total = sum(k.duration for k, _ in items) / n
        cats: dict[str, float] = defaultdict(float)
        for k, cat in items:
            cats[cat] += k.duration / n
        own = [r for r in measured_ranges if r.name == name and any(_inside(r, s) for s in roots[root])]
        wall = sum(r.end - r.start for r in own) / n
        key = name if root in ("step", name) else f"{root}/{name}"
        phases[key] = PhaseStats(key, root, n, len(own), wall, total, len(items) / n,
                                 dict(sorted(cats.items(), key=lambda kv: -kv[1])),
                                 _kernel_stats(items, n, total))
    if not phases:
        raise ProfileError(f"{profile.path}: no kernel ran inside a measured range (ranges: "
                           f"{', '.join(sorted(names))}); were the kernels recorded on the same "
                           "clock, and did the harness measure any step after warm-up?")
    return Breakdown(profile.label, profile.source, profile.path, phases, warm, tune, none,
                     _warnings(phases), list(profile.notes))


_ORDER = (*STEP_RANGES, *PHASES, *ATTENTION_RANGES)


def _phase_order(key: tuple[str, str]) -> tuple[int, int, str]:
    root, name = key
    rank = lambda n: _ORDER.index(n) if n in _ORDER else len(_ORDER)  # noqa: E731
    return (rank(root), rank(name), name)


def _warnings(phases: dict[str, PhaseStats]) -> list[str]:
    out = []
    for p in phases.values():
        share = p.share(Category.OTHER)
        if share >= UNCLASSIFIED_WARN_SHARE:
            top = [k.name for k in p.kernels if k.category == Category.OTHER.value][:3]
            out.append(f"{p.phase}: {share:.0%} of GPU time in unclassified kernels "
                       f"(e.g. {'; '.join(n[:80] for n in top)}); add a pattern to harness.kernels.PATTERNS")
    return out


def _step_phase(bd: Breakdown) -> PhaseStats | None:
    return next((bd.phases[s] for s in STEP_RANGES if s in bd.phases), None)


def _per_range(p: PhaseStats) -> float:
    """How many ranges of the phase's name run per step (e.g. one per layer)."""
    return p.occurrences / p.steps if p.steps else 0.0


def attention_flops(batch: int, seq: int, heads: int, d_head: int) -> dict[str, int]:
    """FLOPs of one naive attention call: QK^T and PV are each 2*B*H*T^2*Dh (the full
    T x T matrix, as the naive path computes it even when causal); the softmax is taken
    as 5 FLOPs per score (max, subtract, exp, sum, divide): 5*B*H*T^2."""
    scores = 2 * batch * heads * seq * seq * d_head
    return {"attn_scores": scores, "attn_softmax": 5 * batch * heads * seq * seq, "attn_values": scores}


def answers(bd: Breakdown, harness_forward_ms: float | None = None,
            metadata: dict | None = None) -> dict[str, dict | list | None]:
    """The report's questions (a)-(e), computed from `bd`; an entry is None when the
    profile lacks what it needs (e.g. no ``forward`` range).

    `harness_forward_ms`: the harness's own forward time per step, if known.
    `metadata`: ``batch``, ``seq``, ``heads``, ``d_head`` for the attention FLOPs of (e).
    """
    fwd, step = bd.phases.get("forward"), _step_phase(bd)
    out: dict[str, dict | list | None] = dict.fromkeys("abcde")
    if fwd:
        ref = harness_forward_ms if harness_forward_ms is not None else fwd.range_ns_per_step / 1e6
        gpu = fwd.gpu_ns_per_step / 1e6
        out["a"] = {"kernel_ms": gpu, "range_ms": fwd.range_ns_per_step / 1e6,
                    "reference": "harness timer" if harness_forward_ms is not None else "NVTX range",
                    "reference_ms": ref, "difference_ms": ref - gpu,
                    "difference_pct": (ref - gpu) / ref * 100 if ref else None}
        top = fwd.kernels[0]
        step_top = step.kernels[0] if step else None
        out["b"] = {"name": top.name, "category": top.category, "share": top.share,
                    "ms_per_forward": top.ns_per_step / _per_range(fwd) / 1e6,
                    "calls_per_forward": top.calls_per_step / _per_range(fwd),
                    "top_in_step": step_top.name == top.name if step_top else None,
                    "step_top": step_top.name if step_top else None,
                    "step_top_share": step_top.share if step_top else None}
        out["c"] = [{"name": k.name, "category": k.category, "share": k.share}
                    for k in fwd.kernels
                    if k.category != Category.GEMM.value and k.share >= NOTABLE_SHARE]
        if step:
            cats = sorted(set(fwd.categories) | set(step.categories))
            growth = [{"category": c,
                       "forward_share": fwd.categories.get(c, 0.0) / fwd.gpu_ns_per_step,
                       "step_share": step.categories.get(c, 0.0) / step.gpu_ns_per_step,
                       "forward_ms": fwd.categories.get(c, 0.0) / 1e6,
                       "step_ms": step.categories.get(c, 0.0) / 1e6} for c in cats]
            out["d"] = {"gemm_forward_share": fwd.share(Category.GEMM),
                        "gemm_step_share": step.share(Category.GEMM),
                        "step": step.phase,
                        "growth": sorted(growth, key=lambda g: g["forward_share"] - g["step_share"])}
    attn = {n: bd.phases[n] for n in ATTENTION_RANGES if n in bd.phases}
    if len(attn) == len(ATTENTION_RANGES):
        ms = {n: p.gpu_ns_per_step / 1e6 for n, p in attn.items()}
        matmuls = ms["attn_scores"] + ms["attn_values"]
        e: dict = {"ms_per_step": ms, "softmax_to_matmuls_time": ms["attn_softmax"] / matmuls if matmuls else None}
        keys = ("batch", "seq", "heads", "d_head")
        if metadata and all(k in metadata for k in keys):
            flops = attention_flops(*(int(metadata[k]) for k in keys))
            e["flops_per_call"] = flops
            e["softmax_to_matmuls_flops"] = flops["attn_softmax"] / (flops["attn_scores"] + flops["attn_values"])
            e["tflops"] = {n: flops[n] * _per_range(p) / p.gpu_ns_per_step / 1e3 if p.gpu_ns_per_step else None
                           for n, p in attn.items()}
        out["e"] = e
    return out


def harness_metadata(path: str | Path) -> dict:
    """From a `harness.run` result JSON: its forward time (mean ms over measured steps,
    the per-step mean the breakdown also uses) and the attention shape for answer (e)."""
    try:
        doc = json.loads(Path(path).read_text())
        opts, cfg = doc["options"], doc["config"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ProfileError(f"{path}: not a harness.run result JSON ({exc!r}); pass the file "
                           "written by `python -m harness.run --out`") from None
    forward = (doc.get("phases") or {}).get("forward") or {}
    return {"forward_ms": forward.get("mean_ms"), "batch": opts["batch"], "seq": opts["ctx"],
            "heads": cfg["num_heads"], "d_head": cfg["d_model"] // cfg["num_heads"]}


def breakdown_files(paths: Sequence[str | Path], labels: Sequence[str | None] = (),
                    run_jsons: Sequence[str | Path] = (), require: Iterable[str] = (),
                    nsys_bin: str | None = None) -> tuple[list[Breakdown], list[dict]]:
    """Breakdowns of profiles and their answers; the i-th label and `harness.run` result
    JSON go with the i-th profile (fewer of them: the rest go without)."""
    require = tuple(require)
    bds, answer_sets = [], []
    for i, path in enumerate(paths):
        bd = breakdown(load_profile(path, labels[i] if i < len(labels) else None, nsys_bin), require)
        meta = harness_metadata(run_jsons[i]) if i < len(run_jsons) else {}
        bds.append(bd)
        answer_sets.append(answers(bd, meta.get("forward_ms"), meta))
    return bds, answer_sets
