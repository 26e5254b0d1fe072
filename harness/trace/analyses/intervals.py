"""Interval arithmetic on kernel timelines, shared by the communication analyses and the
breakdown: unions of intervals, the measure of an intersection, the kernels of the
measured steps, and each device's busy and hidden-communication time. It runs on sorted
arrays: a union is a cumulative max over start-sorted intervals, an intersection's
measure a prefix sum looked up with `searchsorted`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from harness.trace.kernels import Category, classify
from harness.trace.profile import STEP_RANGES, KernelTable, Range


def union(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The disjoint, sorted intervals covering [start, end) intervals (any order)."""
    if len(start) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.argsort(start, kind="stable")
    s, e = np.asarray(start)[order], np.maximum.accumulate(np.asarray(end)[order])
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > e[:-1]  # a gap before this interval: it opens a new merged one
    heads = np.flatnonzero(new)
    tails = np.r_[heads[1:] - 1, len(s) - 1]
    return s[heads], e[tails]


def covered_measure(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> int:
    """Measure of (union a) intersected with (union b); both disjoint and sorted (`union`)."""
    (a_s, a_e), (b_s, b_e) = a, b
    if len(a_s) == 0 or len(b_s) == 0:
        return 0
    before = np.r_[0, np.cumsum(b_e - b_s)]  # b's measure before interval i

    def up_to(x: np.ndarray) -> np.ndarray:  # measure of b within (-inf, x]
        i = np.searchsorted(b_s, x, side="right") - 1
        safe = np.maximum(i, 0)
        inside = np.clip(x - b_s[safe], 0, b_e[safe] - b_s[safe])
        return np.where(i >= 0, before[safe] + inside, 0)

    return int(np.sum(up_to(a_e) - up_to(a_s)))


_CATS = list(Category)


def _categories(kt: KernelTable) -> np.ndarray:
    """Each kernel's category as its index in `Category` (classified once per name)."""
    by_name = np.array([_CATS.index(classify(n)) for n in kt.names] or [0], dtype=np.int8)
    return by_name[kt.name] if len(kt) else np.zeros(0, np.int8)


def _measured(kt: KernelTable, ranges: Sequence[Range]) -> np.ndarray:
    steps = [r for r in ranges if r.name in STEP_RANGES]
    if not steps:
        return np.ones(len(kt), bool)
    s, e = union(np.array([r.start for r in steps]), np.array([r.end for r in steps]))
    i = np.searchsorted(s, kt.start, side="right") - 1
    return (i >= 0) & (kt.end <= e[np.maximum(i, 0)])


def hidden_communication(start: np.ndarray, end: np.ndarray, stream: np.ndarray,
                         comm: np.ndarray) -> tuple[int, int]:
    """(communication ns, hidden ns) of one device's kernels (`comm` marks the communication
    ones, the rest compute): per communication stream, the union of its kernels, and the part
    of it under compute kernels on the device's other streams."""
    total = hidden = 0
    for s in np.unique(stream[comm]):
        mine, others = comm & (stream == s), ~comm & (stream != s)
        c = union(start[mine], end[mine])
        total += int(np.sum(c[1] - c[0]))
        hidden += covered_measure(c, union(start[others], end[others]))
    return total, hidden


def device_timelines(kt: KernelTable, k: np.ndarray, comm: np.ndarray) -> tuple[int, float, float]:
    """(devices, busy ns, hidden communication ns) of the kernels `k` (indices; `comm`
    marks the communication ones), both summed over devices: busy is the union of all
    their intervals per device, over every stream; hidden the part of each communication
    stream's union that runs under the device's other kernels on other streams."""
    devices = np.unique(kt.device[k])
    busy = hidden = 0
    for device in devices:
        on = k[kt.device[k] == device]
        busy += int(np.sum(np.subtract(*union(kt.start[on], kt.end[on])[::-1])))
        hidden += hidden_communication(kt.start[on], kt.end[on], kt.stream[on], comm[kt.device[k] == device])[1]
    return max(len(devices), 1), float(busy), float(hidden)
