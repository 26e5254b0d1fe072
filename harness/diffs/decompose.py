"""Subtract run A from run B: per phase, the gap in time split into parts that add up.

For each phase both runs have (forward, backward, optimizer, step; JAX's fused step
against the other's step when only one side has it), the whole is the gap between the
medians of the harness timer (without a run document: of the profile's range times).
With a profile on both sides the gap is split into

1. host: range time during which no kernel runs (range - the union of the kernels'
   intervals over every stream; never negative), with the kernel-launch calls per step
   and the host time per call where the export has them;
2. GPU time per category group (`GROUPS`), with the kernels that moved most in each;
   communication counts only its exposed part, since the part hidden under compute on
   other streams costs the step nothing beyond the compute it runs beside;

and, where both runs recorded layers, the forward's and backward's GPU time per layer
and per kind of layer (`harness.diffs.layers`), a second view of the same kernels;

and the residual, whole - parts, is what the profile's means do not account for in the
timer's medians (step-to-step noise, the profiler's own cost). The kernel count per
group says whether the same work ran as fewer kernels (fusion); GEMMs are listed by
their decoded precision, tile and transposes. Where the model config is known, GEMM
TFLOP/s is set against the dtype's dense peak and the optimizer's GB/s against HBM.

A gap is inside the noise when the two runs' p10-p90 intervals overlap; with several runs
a side, when the ranges of their medians overlap (`harness.diffs.repeats`).

With a data-parallel run on either side, communication (NCCL's kernels, XLA's
collectives) is always one of the parts, zero where a side has none; where both runs
carry overlap figures, the diff keeps each side's share of communication hidden under
compute and exposed. Every figure is per device: a torch rank's own profile (rank 0's
in a compare folder), and for JAX's one process over N devices the mean of its N device
timelines; a synchronous data-parallel step gives every device the same work, so both
sides stand for one device's share of the step (`Diff.notes` says which).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from harness import backends
from harness.common.documents import DIFF_SCHEMA
from harness.diffs.changes import run_changes
from harness.diffs.clocks import step_clocks
from harness.diffs.inputs import PhaseProfile, Run
from harness.diffs.layers import LayerPhase, diff_layers
from harness.diffs.throughput import Throughput, config_problems, throughput
from harness.diffs.throughput import doc_field as _get
from harness.diffs.work import different_work
from harness.timing.spec import PHASE_ORDER
from harness.trace.analyses.registry import jsonable
from harness.trace.kernels import Category, across_programs

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
    ("other", (Category.OTHER, Category.AUTOTUNING, Category.CONVOLUTION, Category.POOLING, Category.EMBEDDING,
               Category.QUANTIZATION)),
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
    # side -> `harness.diffs.repeats.SideRuns`, where several runs a side were named: then
    # a_ms, b_ms and in_noise are taken over the runs, the rest is of one run a side
    runs: dict = field(default_factory=dict)

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
    schema: str = DIFF_SCHEMA
    layers: list[LayerPhase] = field(default_factory=list)  # per phase, where both runs recorded layers
    overlap: dict[str, dict] = field(default_factory=dict)  # side -> communication, hidden, exposed ms, exposed share
    # what shows that the two sides did different work (`harness.diffs.work`), one clause each
    different_work: list[str] = field(default_factory=list)
    analyses: dict[str, dict] = field(default_factory=dict)  # side -> its profile's registered analyses' results
    clocks: dict[str, dict] = field(default_factory=dict)  # `harness.diffs.clocks.step_clocks`
    changes: list[dict] | None = None  # `harness.diffs.changes.run_changes`: what the sides were run with differently

    def phase(self, name: str) -> PhaseDiff | None:
        return next((p for p in self.phases if p.phase == name), None)

    @property
    def step(self) -> PhaseDiff | None:
        """The whole step: where a side has JAX's fused step beside its split step, the
        faster of the two on that side (timer medians; the fused step on a tie), set against
        the other side's step; else the split step."""
        fused, split = self.phase("fused_step"), self.phase("step")
        if fused and split:
            return min((fused, split), key=lambda p: _fused_sides_ms(fused, p))
        return fused or split or (self.phases[-1] if self.phases else None)


def _fused_sides_ms(fused: PhaseDiff, p: PhaseDiff) -> float:
    """`p`'s time on the sides that have a fused step (a missing time counts as infinite)."""
    ms = [getattr(p, f"{side}_ms") for side in ("a", "b") if getattr(fused, f"{side}_phase") == "fused_step"]
    return sum(x if x == x else float("inf") for x in ms)  # x != x: NaN


def phase_words(p: PhaseDiff, a_label: str, b_label: str) -> str:
    """The phase compared, naming each side's where they differ ("step (A: step, B: fused_step)")."""
    return p.a_phase if p.a_phase == p.b_phase else f"step ({a_label}: {p.a_phase}, {b_label}: {p.b_phase})"


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
    kernels = [[k for k in p.rows if _group_of(k.category) == group] for p in (a, b)]
    compared_as = across_programs(*({k.name for k in side} for side in kernels))
    for side, ks in enumerate(kernels):
        for k in ks:
            r = rows.setdefault(compared_as[k.name], [0.0, 0.0, 0.0, 0.0])
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


def _launches(p: PhaseProfile) -> dict | None:
    return {"per_step": p.launches.per_step, "us_per_launch": p.launches.ns_per_launch / 1e3} if p.launches else None


def host_ms(p: PhaseProfile) -> float:
    """Range time per step during which no kernel of the phase runs on the device: range
    minus the union of kernel intervals (a profile read before the union was recorded:
    minus the kernel sum, floored at zero, as overlapping streams make the sum exceed it)."""
    busy = p.busy_ns if p.busy_ns is not None else p.gpu_ns
    return max(p.range_ns - busy, 0.0) / 1e6


def per_device_note(a: Run, b: Run) -> str | None:
    """Which device each side's profile figures stand for, where either runs on several."""
    if max(devices(a), devices(b)) == 1:
        return None

    def side(run: Run) -> str:
        n = devices(run)
        if n == 1:
            return f"{run.label}: its one device"
        backend = _get(run.doc, ("options", "backend"))
        if backend in backends.names() and backends.get(backend).one_process:
            return f"{run.label}: the mean of its {n} device timelines (one process drives them all)"
        return f"{run.label}: rank 0's own profile (one of {n} ranks)"

    return f"per device: {side(a)}; {side(b)}"


def devices(run: Run) -> int:
    """The devices of a run's step (`--data-parallel`; 1 without a document)."""
    return int(_get(run.doc, ("data_parallel", "n")) or 1)


def _overlap(run: Run, phase: str | None) -> dict | None:
    """A run's communication overlap for the diff: the totals over its profile's measured
    steps, and (`step`) the mean exposed time of the compared kind of step, `phase`."""
    from harness.trace.analyses.overlap import per_step_exposure

    o = run.overlap
    if not o or o.get("hidden_share") is None:
        return None
    out = {"communication_ms": o["communication_ms"], "hidden_ms": o["hidden_ms"], "exposed_ms": o["exposed_ms"],
           "exposed_share": 1 - o["hidden_share"]}
    per = o.get("per_step") or per_step_exposure(o, _get(run.doc, ("options", "steps")))
    if phase in per:
        out["step"] = {"phase": phase, **per[phase]}
    if split := o.get("split"):  # per rank (JAX: per device), the mean over them per measured step
        for key in ("waiting", "transfer"):
            out[f"{key}_ms_per_step"] = sum(r[f"{key}_ms_per_step"] for r in split["ranks"]) / len(split["ranks"])
    return out


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
    ga[COMMUNICATION] -= pa.hidden_communication_ns / 1e6
    gb[COMMUNICATION] -= pb.hidden_communication_ns / 1e6
    out.parts = [Part(HOST, host_ms(pa), host_ms(pb))]
    parallel = max(devices(a), devices(b)) > 1
    out.parts += [Part(g, ga[g], gb[g], ka[g], kb[g], _movers(pa, pb, g))
                  for g, _ in GROUPS if ga[g] or gb[g] or (parallel and g == COMMUNICATION)]
    out.residual_ms = out.decomposed_gap_ms - sum(p.delta_ms for p in out.parts)
    out.a_kernels, out.b_kernels = pa.kernels, pb.kernels
    out.launches = {side: lp for side, p in (("a", pa), ("b", pb)) if (lp := _launches(p))}
    out.gemms = {"a": _gemm_choices(pa), "b": _gemm_choices(pb)}
    out.throughput = throughput(a, b, pair, pa, pb)
    return out


def diff_runs(a: Run, b: Run, force: bool = False) -> Diff:
    """The per-phase decomposition of B's time minus A's (see the module docstring). Raises
    `MismatchError` for runs of different model, shape, dtype, mode or GPU unless `force`."""
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
    if note := per_device_note(a, b):
        notes.append(note)
    phases = [_phase_diff(a, b, pair) for pair in _pairs(a, b)]
    if a.phases is not None and b.phases is not None:  # the throughput lines need both profiles
        notes += [note for run in (a, b) if (note := config_problems(run)[1])]
    if bool(a.layers) != bool(b.layers):
        notes.append(f"{(b if a.layers else a).label}: no layer ranges recorded; no per-layer table")
    d = Diff(a.label, b.label, fields, phases, notes, layers=diff_layers(a.layers, b.layers))
    step = d.step  # the compared step: each side's overlap per step is that kind of step's
    oa, ob = (_overlap(run, getattr(step, f"{side}_phase", None)) for run, side in ((a, "a"), (b, "b")))
    d.overlap = {"a": oa, "b": ob} if oa and ob else {}
    d.different_work = different_work(a, b, (step.phase, step.a_phase, step.b_phase) if step else None, fields)
    d.analyses = {side: {name: jsonable(r) for name, r in run.analyses.items()}
                  for side, run in (("a", a), ("b", b)) if run.analyses}
    d.clocks = step_clocks((step.a_phase, step.b_phase) if step else None, [a], [b])
    d.changes = run_changes([a], [b])
    return d


def regression(diff: Diff, pct: float) -> str | None:
    """One line when B's step median is slower than A's by more than `pct` percent and
    beyond the noise; None otherwise."""
    step = diff.step
    if step is None or not step.a_ms:
        return None
    slower = step.gap_ms / step.a_ms * 100
    if slower > pct and step.in_noise is not True:
        noise = "beyond the noise" if step.in_noise is False else "the noise unknown"
        return (f"{diff.b_label} is {slower:.1f}% slower than {diff.a_label} in "
                f"{phase_words(step, diff.a_label, diff.b_label)} "
                f"({step.a_ms:.3f} -> {step.b_ms:.3f} ms median), more than {pct:g}% and {noise}")
    return None
