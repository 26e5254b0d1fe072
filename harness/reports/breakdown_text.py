"""The words and names every kernel-report table uses: kernel names shortened and kept
distinct, milliseconds, the phases of several profiles in order, and whether their busy
time is a GPU's or a CPU's."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from harness.trace.kernels import NAME_WIDTH, short_name
from harness.trace.stats import Breakdown, PhaseStats


def short_names(names: Sequence[str], width: int = NAME_WIDTH) -> list[str]:
    """`short_name` of each name, kept distinct: names that shorten alike keep their head and
    their tail (where template arguments differ), and any still alike are numbered."""
    out = [short_name(n, width) for n in names]
    for short in {s for s in out if out.count(s) > 1}:
        for i in (i for i, s in enumerate(out) if s == short):
            full = short_name(names[i], 10**6)
            half = max(width // 2 - 1, 8)
            out[i] = full if len(full) <= width else full[:half] + "…" + full[-half:]
    for short in {s for s in out if out.count(s) > 1}:
        for k, i in enumerate([i for i, s in enumerate(out) if s == short], 1):
            out[i] = f"{short} #{k}"
    return out


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f}"


def _phases(bds: Sequence[Breakdown]) -> list[str]:
    seen: list[str] = []
    for bd in bds:
        seen += [p for p in bd.phases if p not in seen]
    return seen


def busy(bds: Sequence[Breakdown]) -> str:
    """What the busy time of these profiles is: "GPU", "CPU" where every profile's kernels
    are CPU ops (no GPU traced), "GPU or CPU" for a mix."""
    cpu = {bd.cpu_ops for bd in bds}
    return "CPU" if cpu == {True} else "GPU" if cpu == {False} else "GPU or CPU"


def _unit(bds: Sequence[Breakdown]) -> str:
    """The name of a profile's unit of work: ops where every profile is a CPU one."""
    return "op" if all(bd.cpu_ops for bd in bds) else "kernel"


def range_metric(bds: Sequence[Breakdown], many: bool) -> tuple[str, Callable[[PhaseStats], str]]:
    """The per-phase table's row of range wall times; where a profile recorded how long the GPU
    waited from a range's start for its first kernel (and one column per profile), that wait in
    brackets after the wall time."""
    if many or all(p.lead_ns_per_step is None for bd in bds for p in bd.phases.values()):
        return "range ms/step", lambda p: _ms(p.range_ns_per_step)
    lead = lambda p: "" if p.lead_ns_per_step is None else f" ({_ms(p.lead_ns_per_step)})"  # noqa: E731
    label = f"range ms/step ({busy(bds)} idle before the first {_unit(bds)})"
    return label, lambda p: _ms(p.range_ns_per_step) + lead(p)
