"""What a kernel breakdown holds: per-phase statistics, the buckets kept out of the phases,
and how the figures were obtained (attribution rule, steady-step rule)."""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass, field, fields, is_dataclass

from harness.trace.kernels import Category, GemmInfo
from harness.trace.profile import ApiStat


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
    inferred_from: str | None = None  # the range whose name set the category (not the kernel's name)
    ops: str | None = None  # what it computes, where XLA's optimized HLO says (`hlo_join.describe`)


@dataclass
class PhaseStats:
    """GPU work inside one range name, per measured step of its root."""

    phase: str  # the range name, or "root/name" where the root is not `step`
    root: str
    steps: int  # steady root ranges holding a range of this name: the per-step divisor
    occurrences: int  # ranges of this name in those steps (more than `steps`: it repeats per layer)
    range_ns_per_step: float  # wall time of the ranges
    gpu_ns_per_step: float
    kernels_per_step: float  # kernels only: memcpys and memsets are `copies_per_step`
    categories: dict[str, float]  # category -> ns per step, every category present
    kernels: list[KernelStat]  # all kernel names, most time first
    copies_per_step: float = 0.0
    gpu_ns_median: float = 0.0  # median over the steps of the kernel time per step
    range_ns_median: float = 0.0  # median over the steps of the range wall time per step
    devices: int = 1  # device timelines the figures are the per-device mean over
    busy_ns_per_step: float | None = None  # union of kernel intervals over streams (None: not recorded)
    hidden_communication_ns_per_step: float = 0.0  # communication under compute kernels on other streams
    # from the start of each range to its first kernel, per device (None: not recorded): the GPU
    # waiting for the host to launch the phase's work
    lead_ns_per_step: float | None = None

    def share(self, category: Category) -> float:
        return self.categories.get(category.value, 0.0) / self.gpu_ns_per_step if self.gpu_ns_per_step else 0.0


@dataclass
class SubRange:
    """Library ranges of one name (module indices folded, `harness.trace.library_ranges`)
    inside one phase, per measured step of the phase."""

    name: str
    library: str  # FSDP, NCCL, torch.compile...
    per_step: float  # ranges of this name inside the phase, per step
    gpu_ns_per_step: float  # the kernels launched (or run) inside them, as the phase counts them
    share: float  # of the phase's GPU time


@dataclass
class Bucket:
    """Kernels kept out of the phases (warm-up, autotuning, outside every step...)."""

    count: int = 0
    ns: int = 0
    ranges: dict[str, int] = field(default_factory=dict)  # innermost range -> ns
    names: list[str] = field(default_factory=list)  # distinct kernel names, most time first (a few)


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
    first_step: Bucket = field(default_factory=Bucket)  # the first instance, where no `warmup` range exists
    first_only: Bucket = field(default_factory=Bucket)  # names that ran only in the first steady instance
    attribution: str = "execution"  # "execution", "launch", or "none" (no ranges)
    attribution_reason: str = ""
    outside_share: float | None = None  # kernel time launched in a range but run outside every range
    moved_share: float | None = None  # kernel time whose range differs between the two rules
    steady_rule: str = ""  # which instances the per-step figures average, in words
    api: list[ApiStat] = field(default_factory=list)
    layers: dict[str, dict[str, float]] = field(default_factory=dict)  # phase -> canonical layer -> ns per step
    cpu_ops: bool = False  # CPU ops stand in for kernels: times are host times, not GPU times
    library_ranges: dict[str, list[SubRange]] = field(default_factory=dict)  # phase -> its library sub-ranges


def from_document(cls: type, doc: dict):
    """The `cls` dataclass that `dataclasses.asdict` (and JSON) made `doc` from, nested
    dataclasses, lists and dicts rebuilt by the field types; keys a newer `cls` added take
    their defaults, keys it no longer has are dropped. A required field missing raises
    ``TypeError`` naming it."""
    hints = typing.get_type_hints(cls)
    return cls(**{f.name: _typed(hints[f.name], doc[f.name]) for f in fields(cls) if f.name in doc})


def _typed(tp: object, value: object) -> object:
    if value is None:
        return None
    if is_dataclass(tp):
        return from_document(tp, value)
    args = typing.get_args(tp)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return _typed(next(a for a in args if a is not type(None)), value)
    if origin is list:
        return [_typed(args[0], v) for v in value]
    if origin is dict:
        return {k: _typed(args[1], v) for k, v in value.items()}
    return value


def breakdowns_of(doc: list[dict]) -> tuple[list[Breakdown], list[dict]]:
    """The breakdowns and answers of a kernels.json (`harness.reports.breakdown.write_report`)."""
    return [from_document(Breakdown, bd) for bd in doc], [bd.get("answers", {}) for bd in doc]
