"""Subtract run A from run B: per phase, the gap in time split into parts that add up.

For each phase both runs have (forward, backward, optimizer, step; JAX's fused step
against the other's step when only one side has it), the whole is the gap between the
medians of the harness timer (without a run document: of the profile's range times).
With a profile on both sides the gap is split into

1. host: range time not covered by GPU work (range - sum of kernel times), with the
   kernel-launch calls per step and the host time per call where the export has them;
2. GPU time per category group (`GROUPS`), with the kernels that moved most in each;

and, where both runs recorded layers, the forward's and backward's GPU time per layer
and per kind of layer (`harness.diffs.layers`), a second view of the same kernels;

and the residual, whole - parts, is what the profile's means do not account for in the
timer's medians (step-to-step noise, the profiler's own cost). The kernel count per
group says whether the same work ran as fewer kernels (fusion); GEMMs are listed by
their decoded precision, tile and transposes. Where the model config is known, GEMM
TFLOP/s is set against the dtype's dense peak and the optimizer's GB/s against HBM.

A gap is inside the noise when the two runs' p10-p90 intervals overlap.

With a data-parallel run on either side, communication (NCCL's kernels, XLA's
collectives) is always one of the parts, zero where a side has none; where both runs
carry overlap figures, the diff keeps each side's share of communication hidden under
compute and exposed.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from harness.common.hardware import hbm_tbps, peak_tflops
from harness.config import ModelConfig
from harness.diffs.inputs import PhaseProfile, Run
from harness.diffs.layers import LayerPhase, diff_layers
from harness.timing.flops import optimizer_bytes, phase_flops
from harness.timing.spec import PHASE_ORDER
from harness.trace.kernels import Category

SCHEMA = "harness.diff/1"
COMMUNICATION = "communication"  # the group of NCCL's kernels and XLA's collectives
# Report groups of harness.trace.kernels.Category, in the order tables list them.
GROUPS: tuple[tuple[str, tuple[Category, ...]], ...] = (
    ("GEMM", (Category.GEMM,)),
    ("attention", (Category.ATTENTION,)),
    ("fused/elementwise", (Category.ELEMENTWISE,)),
    ("reduction/norm/softmax", (Category.REDUCTION, Category.NORM, Category.SOFTMAX)),
    ("copy/cast", (Category.MEMORY,)),
    ("optimizer", (Category.OPTIMIZER,)),
    (COMMUNICATION, (Category.COMMUNICATION,)),
    ("other", (Category.OTHER, Category.AUTOTUNING)),
)
HOST = "host"
# Fields that must match for a like-for-like comparison: (label, where in the run document).
MATCH_FIELDS = (("model", ("options", "model")), ("ctx", ("options", "ctx")), ("batch", ("options", "batch")),
                ("dtype", ("options", "dtype")), ("mode", ("options", "mode")), ("device", ("env", "device")))
MOVERS = 3


class MismatchError(ValueError):
    """Runs that do not compare like for like; the message names the field."""


@dataclass
class Timing:
    median_ms: float
    p10_ms: float
    p90_ms: float
    std_ms: float
    n: int
    mean_ms: float


@dataclass
class Mover:
    name: str
    a_ms: float
    b_ms: float
    a_calls: float
    b_calls: float


@dataclass
class Part:
    """One cause: A's and B's ms per step, and for GPU groups the kernel count and movers."""

    name: str
    a_ms: float
    b_ms: float
    a_kernels: float | None = None
    b_kernels: float | None = None
    movers: list[Mover] = field(default_factory=list)

    @property
    def delta_ms(self) -> float:
        return self.b_ms - self.a_ms


@dataclass
class Throughput:
    what: str  # "GEMM", "optimizer"
    unit: str  # "TFLOP/s", "GB/s"
    bound_name: str  # "bf16 dense peak", "HBM"
    a: float | None
    b: float | None
    a_bound: float | None
    b_bound: float | None


@dataclass
class PhaseDiff:
    phase: str
    a_phase: str  # the phase of each run it compares (JAX's fused step against a step)
    b_phase: str
    a: Timing | None
    b: Timing | None
    a_ms: float  # the whole, each side
    b_ms: float
    whole: str  # what the whole is measured with
    in_noise: bool | None
    parts: list[Part]  # host, then GPU groups; empty without two profiles
    residual_ms: float | None
    a_kernels: float | None = None
    b_kernels: float | None = None
    launches: dict[str, dict] = field(default_factory=dict)  # side -> per_step, us_per_launch
    gemms: dict[str, list[dict]] = field(default_factory=dict)  # side -> decoded GEMM choices
    throughput: list[Throughput] = field(default_factory=list)

    @property
    def gap_ms(self) -> float:
        return self.b_ms - self.a_ms

    @property
    def decomposed_gap_ms(self) -> float:
        """The gap the parts decompose: of the timer's means where both sides have them (the
        profile's per-step figures are means over the same measured steps), else `gap_ms`."""
        return self.b.mean_ms - self.a.mean_ms if self.a and self.b else self.gap_ms


@dataclass
class Diff:
    a_label: str
    b_label: str
    fields: dict[str, tuple]  # MATCH_FIELDS label -> (A's, B's)
    phases: list[PhaseDiff]
    notes: list[str]
    schema: str = SCHEMA
    layers: list[LayerPhase] = field(default_factory=list)  # per phase, where both runs recorded layers
    # side ("a", "b") -> communication, hidden, exposed ms over the measured steps and the
    # exposed share of the communication; only where both runs have overlap figures
    overlap: dict[str, dict] = field(default_factory=dict)

    def phase(self, name: str) -> PhaseDiff | None:
        return next((p for p in self.phases if p.phase == name), None)

    @property
    def step(self) -> PhaseDiff | None:
        """The whole step: JAX's fused step where a side has one (the step JAX users run,
        compared with torch's step as `harness.compare` does), else the split step."""
        return self.phase("fused_step") or self.phase("step") or (self.phases[-1] if self.phases else None)


def _get(doc: dict | None, path: tuple[str, ...]) -> object:
    for key in path:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (pos - lo)


def timing(run: Run, phase: str) -> Timing | None:
    """The harness timer's spread of `phase` in `run`'s document (None without one)."""
    p = _get(run.doc, ("phases", phase))
    if not p or not p.get("times_ms"):
        return None
    xs = p["times_ms"]
    return Timing(statistics.median(xs), _quantile(xs, 0.1), _quantile(xs, 0.9),
                  statistics.stdev(xs) if len(xs) > 1 else 0.0, len(xs), statistics.fmean(xs))


def check_match(a: Run, b: Run) -> dict[str, tuple]:
    """MATCH_FIELDS of both runs; raise `MismatchError` naming the first that differs."""
    fields = {label: (_get(a.doc, path), _get(b.doc, path)) for label, path in MATCH_FIELDS}
    for label, (x, y) in fields.items():
        if x is not None and y is not None and x != y:
            raise MismatchError(f"A and B differ in {label} ({x} vs {y}); pass --force to compare them anyway")
    return fields


def _pairs(a: Run, b: Run) -> list[tuple[str, str, str]]:
    have_a = set(_get(a.doc, ("phases",)) or {}) | set(a.phases or {})
    have_b = set(_get(b.doc, ("phases",)) or {}) | set(b.phases or {})
    pairs = [(p, p, p) for p in PHASE_ORDER if p in have_a and p in have_b]
    if "fused_step" in have_b and "fused_step" not in have_a and "step" in have_a:
        pairs.append(("fused_step", "step", "fused_step"))
    elif "fused_step" in have_a and "fused_step" not in have_b and "step" in have_b:
        pairs.append(("fused_step", "fused_step", "step"))
    return pairs


def _group_of(category: str) -> str:
    return next((name for name, cats in GROUPS if category in {c.value for c in cats}), "other")


def _group_ms(p: PhaseProfile) -> dict[str, float]:
    out = dict.fromkeys((name for name, _ in GROUPS), 0.0)
    for category, ns in p.categories.items():
        out[_group_of(category)] += ns / 1e6
    return out


def _group_kernels(p: PhaseProfile) -> dict[str, float]:
    out = dict.fromkeys((name for name, _ in GROUPS), 0.0)
    for k in p.rows:
        out[_group_of(k.category)] += k.calls_per_step
    return out


def _movers(a: PhaseProfile, b: PhaseProfile, group: str) -> list[Mover]:
    rows: dict[str, list[float]] = {}
    for side, p in ((0, a), (1, b)):
        for k in p.rows:
            if _group_of(k.category) == group:
                r = rows.setdefault(k.name, [0.0, 0.0, 0.0, 0.0])
                r[side] += k.ns_per_step / 1e6
                r[2 + side] += k.calls_per_step
    ranked = sorted(rows.items(), key=lambda kv: -abs(kv[1][1] - kv[1][0]))
    return [Mover(name, *r) for name, r in ranked[:MOVERS]]


def _gemm_choices(p: PhaseProfile) -> list[dict]:
    """GEMM time per decoded (precision, tile, transposes), most time first."""
    out: dict[tuple, dict] = {}
    for k in p.rows:
        if k.category == Category.GEMM.value:
            g = k.gemm or {}
            key = (g.get("math"), g.get("tile"), g.get("transpose"))
            row = out.setdefault(key, {"math": key[0], "tile": key[1], "transpose": key[2], "ms": 0.0,
                                       "calls": 0.0, "names": 0})
            row["ms"] += k.ns_per_step / 1e6
            row["calls"] += k.calls_per_step
            row["names"] += 1
    return sorted(out.values(), key=lambda r: -r["ms"])


def _config(run: Run) -> ModelConfig | None:
    cfg = _get(run.doc, ("config",))
    try:
        return ModelConfig(**cfg) if isinstance(cfg, dict) else None
    except (TypeError, ValueError):
        return None


def _gemm_flops(run: Run, phase: str, p: PhaseProfile) -> float | None:
    """Matmul FLOPs of `phase` run as GEMM kernels: all of them, less the attention
    products where fused-attention kernels ran them."""
    config, batch, ctx = _config(run), _get(run.doc, ("options", "batch")), _get(run.doc, ("options", "ctx"))
    if config is None or not batch or not ctx:
        return None
    total = phase_flops(config, batch, ctx).get(phase, 0)
    passes = total / phase_flops(config, batch, ctx)["forward"]
    attention = passes * config.num_layers * 4 * batch * ctx * ctx * config.d_model
    return total - attention if p.categories.get(Category.ATTENTION.value) else total


def _throughput(a: Run, b: Run, pair: tuple[str, str, str], pa: PhaseProfile, pb: PhaseProfile) -> list[Throughput]:
    out = []
    gemm, opt = {}, {}
    for side, run, phase, p in (("a", a, pair[1], pa), ("b", b, pair[2], pb)):
        ns = p.categories.get(Category.GEMM.value, 0.0)
        flops = _gemm_flops(run, phase, p)
        device, dtype = _get(run.doc, ("env", "device")), _get(run.doc, ("options", "dtype"))
        gemm[side] = (flops / ns / 1e3 if flops and ns else None, peak_tflops(device, dtype))
        config = _config(run)
        ons = p.categories.get(Category.OPTIMIZER.value, 0.0)
        opt[side] = (optimizer_bytes(config) / ons if config and ons and phase != "forward" else None,
                     (tbps * 1e3 if (tbps := hbm_tbps(device)) else None))
    dtype = _get(a.doc, ("options", "dtype")) or "?"
    if gemm["a"][0] or gemm["b"][0]:
        out.append(Throughput("GEMM", "TFLOP/s", f"{dtype} dense peak", gemm["a"][0], gemm["b"][0],
                              gemm["a"][1], gemm["b"][1]))
    if opt["a"][0] or opt["b"][0]:
        out.append(Throughput("optimizer", "GB/s", "HBM bandwidth", opt["a"][0], opt["b"][0], opt["a"][1], opt["b"][1]))
    return out


def _launches(p: PhaseProfile) -> dict | None:
    return {"per_step": p.launches.per_step, "us_per_launch": p.launches.ns_per_launch / 1e3} if p.launches else None


def devices(run: Run) -> int:
    """The devices of a run's step (`--data-parallel`; 1 without a document)."""
    return int(_get(run.doc, ("data_parallel", "n")) or 1)


def _overlap(run: Run) -> dict | None:
    o = run.overlap
    if not o or o.get("hidden_share") is None:
        return None
    return {"communication_ms": o["communication_ms"], "hidden_ms": o["hidden_ms"], "exposed_ms": o["exposed_ms"],
            "exposed_share": 1 - o["hidden_share"]}


def _phase_diff(a: Run, b: Run, pair: tuple[str, str, str]) -> PhaseDiff:
    name, phase_a, phase_b = pair
    ta, tb = timing(a, phase_a), timing(b, phase_b)
    pa = (a.phases or {}).get(phase_a)
    pb = (b.phases or {}).get(phase_b)
    if ta and tb:
        a_ms, b_ms, whole = ta.median_ms, tb.median_ms, "harness timer, median"
        in_noise = ta.p10_ms <= tb.p90_ms and tb.p10_ms <= ta.p90_ms
    else:
        a_ms = ta.median_ms if ta else (pa.range_ns / 1e6 if pa else float("nan"))
        b_ms = tb.median_ms if tb else (pb.range_ns / 1e6 if pb else float("nan"))
        whole, in_noise = "harness timer where recorded, else the profile's mean range time", None
    out = PhaseDiff(name, phase_a, phase_b, ta, tb, a_ms, b_ms, whole, in_noise, [], None)
    if pa is None or pb is None:
        return out
    ga, gb, ka, kb = _group_ms(pa), _group_ms(pb), _group_kernels(pa), _group_kernels(pb)
    out.parts = [Part(HOST, (pa.range_ns - pa.gpu_ns) / 1e6, (pb.range_ns - pb.gpu_ns) / 1e6)]
    parallel = max(devices(a), devices(b)) > 1
    out.parts += [Part(g, ga[g], gb[g], ka[g], kb[g], _movers(pa, pb, g))
                  for g, _ in GROUPS if ga[g] or gb[g] or (parallel and g == COMMUNICATION)]
    out.residual_ms = out.decomposed_gap_ms - sum(p.delta_ms for p in out.parts)
    out.a_kernels, out.b_kernels = pa.kernels, pb.kernels
    out.launches = {side: lp for side, p in (("a", pa), ("b", pb)) if (lp := _launches(p))}
    out.gemms = {"a": _gemm_choices(pa), "b": _gemm_choices(pb)}
    out.throughput = _throughput(a, b, pair, pa, pb)
    return out


def diff_runs(a: Run, b: Run, force: bool = False) -> Diff:
    """The per-phase decomposition of B's time minus A's (see the module docstring).

    Raises `MismatchError` for runs of different model, shape, dtype, mode or GPU unless
    `force`."""
    if force:
        fields = {label: (_get(a.doc, path), _get(b.doc, path)) for label, path in MATCH_FIELDS}
    else:
        fields = check_match(a, b)
    notes = [*a.notes, *b.notes]
    if a.doc is None or b.doc is None:
        notes.append("a side without a harness.run document: its fields were not checked")
    for run in (a, b):
        if run.phases is None:
            notes.append(f"{run.label}: no profile; only the phase-level gap")
    if devices(a) != devices(b):
        notes.append(f"A runs on {devices(a)} device(s), B on {devices(b)}, each with its --batch per device: "
                     "B's step covers a global batch of another size")
    phases = [_phase_diff(a, b, pair) for pair in _pairs(a, b)]
    if bool(a.layers) != bool(b.layers):
        notes.append(f"{(b if a.layers else a).label}: no layer ranges recorded; no per-layer table")
    overlap = {"a": oa, "b": ob} if (oa := _overlap(a)) and (ob := _overlap(b)) else {}
    return Diff(a.label, b.label, fields, phases, notes, layers=diff_layers(a.layers, b.layers), overlap=overlap)


def regression(diff: Diff, pct: float) -> str | None:
    """One line when B's step median is slower than A's by more than `pct` percent and
    beyond the noise; None otherwise."""
    step = diff.step
    if step is None or not step.a_ms:
        return None
    slower = step.gap_ms / step.a_ms * 100
    if slower > pct and step.in_noise is not True:
        return (f"{diff.b_label} is {slower:.1f}% slower than {diff.a_label} in {step.phase} "
                f"({step.a_ms:.3f} -> {step.b_ms:.3f} ms median), more than {pct:g}% and beyond the noise")
    return None
