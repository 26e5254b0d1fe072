"""Each side's GPU clock over the compared step, for `Diff.clocks`: a GPU-bound step's time moves
with the clock it ran at, so a gap between runs of the same code can be the clock's
(`harness.timing.clocks` samples it; `docs/results.md`)."""

from __future__ import annotations

import statistics

from harness.diffs.inputs import Run
from harness.timing.clocks import INSTANT, MEAN


def _record(run: Run, phase: str | None) -> dict:
    return (((run.doc or {}).get("gpu_clocks") or {}).get("phases") or {}).get(phase) or {}


def step_clock(run: Run, phase: str | None) -> float | None:
    """The median SM clock (MHz) over a run's measured calls of `phase`, where its document
    sampled the GPU's clock (`harness.timing.clocks`); else None."""
    return (_record(run, phase).get("sm_mhz") or {}).get("median")


def _median_or_none(values: list) -> float | None:
    return None if not values or any(v is None for v in values) else statistics.median(values)


def _reading(records: list[dict]) -> str:
    """Which power reading a side's figure is: the instantaneous one only where every run's is."""
    return INSTANT if all((rec.get("power_w") or {}).get("reading") == INSTANT for rec in records) else MEAN


def step_clocks(phases: tuple[str, str] | None, a: list[Run], b: list[Run]) -> dict[str, dict]:
    """`Diff.clocks`: per side ("a", "b"), the median clock over its runs of the compared step
    (`phases`: A's phase and B's) and each run's, with the median of the runs' power draws
    (`watts`, which `reading`) and of their shares of samples at the power cap (`capped`), each
    None where a run did not read it; empty where a run has no clock."""
    if phases is None:
        return {}
    out = {}
    for side, runs, phase in (("a", a, phases[0]), ("b", b, phases[1])):
        mhz = [step_clock(r, phase) for r in runs]
        if any(m is None for m in mhz):
            return {}
        records = [_record(r, phase) for r in runs]
        out[side] = {"mhz": statistics.median(mhz), "runs": mhz,
                     "watts": _median_or_none([(rec.get("power_w") or {}).get("median") for rec in records]),
                     "capped": _median_or_none([rec.get("power_capped") for rec in records]),
                     "reading": _reading(records)}
    return out

