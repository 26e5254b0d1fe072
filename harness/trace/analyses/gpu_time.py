"""Holistic Trace Analysis's per-rank figures, computed on a `Profile`: temporal breakdown,
kernel launch statistics, queue length and communication/computation overlap.

Definitions (HTA's, over the GPU activities of one rank, every device and stream):

- temporal breakdown: the span from the first start to the last end; idle = span minus
  the union of all activities; compute = the union of compute kernels (neither
  communication nor memcpy/memset); non-compute = span - compute - idle.
- overlap: the measure of union(compute) intersected with union(communication), over the
  measure of union(communication). `harness.trace.analyses.overlap` differs: it takes
  each communication stream against compute on the device's *other* streams, inside the
  step ranges only.
- launch statistics: activities launched by cudaLaunchKernel[ExC], cudaMemcpyAsync or
  cudaMemsetAsync (scope ``all``: and ROCm's hipLaunchKernel, hipExtModuleLaunchKernel,
  hipMemcpyAsync, hipMemsetAsync, hipMemcpyWithStream; HTA 0.5.0 counts none of these);
  launch delay = GPU start minus the launch call's end (0 if negative);
  short kernels ran shorter than their launch call; outliers: launch calls over 50 µs,
  delays over 100 µs.
- queue length, per stream: +1 at each launch call (those, ROCm's too, and cuLaunchKernel),
  -1 at each start, in time order (a launch first at equal times); the count of changes and
  the max and mean of the values after each change. Needs the launch calls (torch.profiler traces).

Scopes: ``all`` takes every GPU activity, with times exact to the ns. ``hta`` is HTA's
default: where the trace holds two or more ``ProfilerStep`` names, only activities whose
launch call is in the trace and began before the last ``ProfilerStep`` (HTA leaves the last,
incomplete step out); with fewer, every activity (HTA filters nothing). Times in µs as HTA
reads them (a start with ns decimals rounded up, an end down, in float64). HTA also counts
Kineto's synchronization records on a stream (`Profile.syncs`: ``Stream Wait Event``,
``Stream Sync``; any whose stream is not -1) as GPU activities, busy time and, unless the
name ends in ``Sync``, compute: so does scope ``hta``, and scope ``all`` leaves them out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

from harness.trace.analyses.intervals import covered_measure, union
from harness.trace.analyses.registry import Context, analysis
from harness.trace.kernels import Category, classify
from harness.trace.profile import KERNEL, LAUNCH_APIS, PROFILER_STEP, UNKNOWN, KernelTable, Profile, Range

SCOPES = ("all", "hta")
RUNTIME_CUTOFF_US, DELAY_CUTOFF_US = 50, 100
_HTA_LAUNCH_STATS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync", "cudaMemsetAsync")
_ROCM_LAUNCH_STATS = ("hipLaunchKernel", "hipExtModuleLaunchKernel", "hipMemcpyAsync", "hipMemsetAsync",
                      "hipMemcpyWithStream")
_LAUNCH_STATS_APIS = {"hta": [LAUNCH_APIS.index(a) for a in _HTA_LAUNCH_STATS],
                      "all": [LAUNCH_APIS.index(a) for a in (*_HTA_LAUNCH_STATS, *_ROCM_LAUNCH_STATS)]}
# HTA 0.5.0's names of no compute (its ComputeKernelGroupingPattern, inverted): `Stream Sync`
# is none, `Stream Wait Event` is compute
_HTA_NOT_COMPUTE = re.compile(r"(^nccl)|(.*Memcpy)|(.*Memset)|(.*dma)|(^.*Sync)|(cuda.*LaunchKernel)|(^runFunction)")


def _hta_us(start_ns: np.ndarray, end_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) in µs as HTA reads a trace: float64 µs, start rounded up, end down.

    The float of an epoch time in µs must be the one JSON parsing gives (the nearest to
    the decimal); ``start_ns / 1000`` would round twice (int64 to float64 first, ns of
    1.7e18 in steps of 256), so whole µs and the ns fraction are added instead."""
    ts = (start_ns // 1000).astype(np.float64) + (start_ns % 1000) / 1000
    end = ts + (end_ns - start_ns) / 1000
    return np.ceil(ts).astype(np.int64), np.floor(end).astype(np.int64)


def _last_step_start(ranges: Sequence[Range]) -> int | None:
    """The last ProfilerStep's start, where the ranges hold two or more ProfilerStep names
    (HTA counts names: with fewer it filters nothing)."""
    steps = [r for r in ranges if r.name.startswith(PROFILER_STEP)]
    return max(r.start for r in steps) if len({r.name for r in steps}) >= 2 else None


def _columns(kt: KernelTable, compute: np.ndarray, comm: np.ndarray) -> dict[str, np.ndarray]:
    """`kt`'s columns the figures use, with per row whether it is compute, communication."""
    cols = {col: getattr(kt, col) for col in ("start", "end", "launch", "launch_end", "stream")}
    cols["api"], cols["compute"], cols["comm"] = kt.launch_api, compute, comm
    return cols


def _times(profile: Profile, scope: str) -> dict[str, np.ndarray]:
    """Per activity in scope: start, end, launch start and end (µs, float in scope all),
    stream, launch API, whether compute, whether communication (HTA's synchronization
    records too, in scope hta)."""
    kt = profile.kernels
    kernel = kt.kind == KERNEL
    comm = kernel & np.array([classify(n) is Category.COMMUNICATION for n in kt.names] or [False])[kt.name]
    parts = [_columns(kt, kernel & ~comm, comm)]
    if scope == "hta" and profile.syncs is not None:
        sy = profile.syncs.take(profile.syncs.stream != UNKNOWN)
        compute = np.array([not _HTA_NOT_COMPUTE.match(n) for n in sy.names] or [False])[sy.name]
        parts.append(_columns(sy, compute, np.zeros(len(sy), bool)))
    t = {col: np.concatenate([p[col] for p in parts]) for col in parts[0]}
    keep = np.ones(len(t["start"]), bool)
    if scope == "hta":
        last = _last_step_start(profile.ranges)
        if last is not None:
            keep = t["launch"] != UNKNOWN
            keep &= _hta_us(t["launch"], t["launch"])[0] < _hta_us(np.array([last]), np.array([last]))[0][0]
    out = {col: v[keep] for col, v in t.items()}
    out["launched"] = out["launch"] != UNKNOWN
    out["per_us"] = 1000  # time units per µs: ns, exact
    if scope == "hta" and np.any(t["start"] % 1000):  # HTA rounds only a trace with fractional µs starts
        out["start"], out["end"] = _hta_us(out["start"], out["end"])
        out["launch"], out["launch_end"] = _hta_us(out["launch"], out["launch_end"])
        out["per_us"] = 1
    return out


def _measure(s: np.ndarray, e: np.ndarray) -> int:
    u = union(s, e)
    return int(np.sum(u[1] - u[0]))


@analysis("gpu_time", "GPU time (HolisticTraceAnalysis's figures)")
def _registered(profile: Profile, context: Context) -> dict:
    """`gpu_time` in the column's scope: the report's gpu_time.json and its table."""
    return gpu_time(profile, context.scope)


def gpu_time(profile: Profile, scope: str = "all") -> dict:
    """HTA's four analyses of one rank's profile (module docstring); times in µs."""
    t = _times(profile, scope)
    comm, compute = t["comm"], t["compute"]
    us = t["per_us"]
    span = int(t["end"].max() - t["start"].min()) if len(t["start"]) else 0
    busy = _measure(t["start"], t["end"])
    comp = _measure(t["start"][compute], t["end"][compute])
    comm_u = union(t["start"][comm], t["end"][comm])
    comm_total = int(np.sum(comm_u[1] - comm_u[0]))
    hidden = covered_measure(comm_u, union(t["start"][compute], t["end"][compute])) if comm_total else 0
    temporal = {"kernel_time_us": span / us, "idle_time_us": (span - busy) / us, "compute_time_us": comp / us,
                "non_compute_time_us": (busy - comp) / us}
    return {"scope": scope, "activities": len(t["start"]), "temporal": temporal,
            "overlap": hidden / comm_total if comm_total else None, "communication_us": comm_total / us,
            "launch": _launch_stats(t, scope), "queue": _queue(t)}


def _launch_stats(t: dict[str, np.ndarray], scope: str) -> dict | None:
    mine = t["launched"] & np.isin(t["api"], _LAUNCH_STATS_APIS[scope])
    if not mine.any():
        return None
    us = t["per_us"]
    cpu = t["launch_end"][mine] - t["launch"][mine]
    gpu = t["end"][mine] - t["start"][mine]
    delay = np.maximum(t["start"][mine] - t["launch_end"][mine], 0)
    return {"events": int(mine.sum()), "launch_delay_sum_us": int(delay.sum()) / us,
            "cpu_duration_sum_us": int(cpu.sum()) / us, "gpu_duration_sum_us": int(gpu.sum()) / us,
            "gpu_shorter_than_cpu": int(np.sum(gpu < cpu)),
            "runtime_over_50us": int(np.sum(cpu > RUNTIME_CUTOFF_US * us)),
            "launch_delay_over_100us": int(np.sum(delay > DELAY_CUTOFF_US * us))}


def _queue(t: dict[str, np.ndarray]) -> dict[int, dict] | None:
    mine = t["launched"] & (t["api"] != UNKNOWN)
    if not mine.any():
        return None
    out = {}
    for stream in np.unique(t["stream"][mine]):
        on = mine & (t["stream"] == stream)
        times = np.concatenate([t["launch"][on], t["start"][on]])
        steps = np.concatenate([np.ones(on.sum(), np.int64), -np.ones(on.sum(), np.int64)])
        order = np.argsort(times, kind="stable")  # launches come first in `times`: first at equal times
        length = np.cumsum(steps[order])
        out[int(stream)] = {"count": len(length), "max": int(length.max()), "mean": float(length.mean())}
    return out


def summary_line(figures: dict) -> str:
    """One line of the temporal breakdown and overlap, as percentages of the span."""
    tb = figures["temporal"]
    span = tb["kernel_time_us"] or math.inf
    overlap = f"{figures['overlap']:.2%}" if figures["overlap"] is not None else "no communication"
    return (f"compute {tb['compute_time_us'] / span:.2%}, non-compute {tb['non_compute_time_us'] / span:.2%}, "
            f"idle {tb['idle_time_us'] / span:.2%} of {tb['kernel_time_us'] / 1e3:.3f} ms; "
            f"communication overlapped by compute: {overlap}")
