"""The attention tools' timing core: calls per repeat, interleaved rounds, lead-in, failures
(the median and range of the repeats: `harness.common.stats.summarize`).

A repeat launches enough back-to-back calls to last `min_batch_ms`, so its fixed cost
(first launch, final sync) is spread thin; the entries of one cell take their repeats in
rotating rounds, so drift over the run falls on all of them alike; with a lead-in each
timed repeat follows untimed calls of the same entry, so a GPU at its power limit is
timed at that entry's own steady clock.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from harness.common.errors import is_oom
from harness.common.stats import summarize

if TYPE_CHECKING:
    from harness.attention.options import MeasureOptions

# Calls per repeat are capped so that a fast pass cannot make one repeat run
# for seconds on a CPU smoke run.
MAX_CALLS_PER_REPEAT = 1000


def calls_per_repeat(thunk: Callable, sync: Callable, timer: str, warmup: int, min_batch_ms: float) -> int:
    """Warms `thunk` up, then returns how many back-to-back calls make one
    repeat last at least `min_batch_ms`, found by timing growing batches.

    A repeat pays a fixed cost once (the first launch reaching an idle GPU,
    the final synchronization: tens of microseconds, now and then
    milliseconds); spread over too few calls it inflates short passes (with
    3 ms repeats it added 10-15% to a 0.25 ms forward on an H100). Timing a
    single call would count that cost in full and pick too few calls."""
    for _ in range(warmup):
        sync(thunk())
    n = 1
    while n < MAX_CALLS_PER_REPEAT:
        batch_ms = repeat_ms(thunk, sync, timer, n) * n
        if batch_ms >= min_batch_ms:
            break
        n = min(MAX_CALLS_PER_REPEAT, max(2 * n, math.ceil(1.2 * n * min_batch_ms / max(batch_ms, 1e-3))))
    return n


def repeat_ms(thunk: Callable, sync: Callable, timer: str, n: int) -> float:
    """One repeat: `n` back-to-back calls; milliseconds per call (CUDA events
    for PyTorch, the host clock around launches and one final sync for JAX)."""
    if timer == "cuda":
        import torch

        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(n):
            thunk()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) / n
    start = time.perf_counter()
    for _ in range(n):
        result = thunk()
    sync(result)
    return (time.perf_counter() - start) * 1e3 / n


def lead_in(thunk: Callable, sync: Callable, timer: str, n: int, ms: float) -> None:
    """Untimed repeats of `n` calls until at least `ms` milliseconds have passed."""
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        repeat_ms(thunk, sync, timer, n)


def time_interleaved(entries: dict, *, warmup: int, iters: int, min_batch_ms: float,
                     lead_in_ms: float = 0.0) -> dict[object, tuple[float, float, float] | Exception]:
    """Times every entry (key -> (thunk, sync, timer)) with `iters` repeats,
    taken in rounds: one repeat of each entry per round, the order rotated by
    one each round, so drift over the run lands on every entry alike instead
    of on whichever ran last. With `lead_in_ms`, each timed repeat follows
    that long of untimed calls of the same entry (see the module docstring).

    Returns key -> (median, min, max) ms per call, or the exception that
    entry raised (it is dropped from later rounds; the others go on)."""
    out: dict[object, tuple[float, float, float] | Exception] = {}
    calls: dict[object, int] = {}
    for key, (thunk, sync, timer) in entries.items():
        try:
            calls[key] = calls_per_repeat(thunk, sync, timer, warmup, min_batch_ms)
        except Exception as exc:  # noqa: BLE001 -- reported per entry
            out[key] = exc
    samples: dict[object, list[float]] = {key: [] for key in calls}
    keys = list(calls)
    for round_ in range(iters):
        shift = round_ % len(keys) if keys else 0
        for key in keys[shift:] + keys[:shift]:
            if key in out:
                continue
            thunk, sync, timer = entries[key]
            try:
                if lead_in_ms > 0:
                    lead_in(thunk, sync, timer, calls[key], lead_in_ms)
                samples[key].append(repeat_ms(thunk, sync, timer, calls[key]))
            except Exception as exc:  # noqa: BLE001
                out[key] = exc
    for key, got in samples.items():
        if key not in out:
            summary = summarize(got)
            out[key] = (summary["median_ms"], summary["min_ms"], summary["max_ms"])
    return out


def time_ms(thunk: Callable, sync: Callable, timer: str, options: MeasureOptions) -> tuple[float, float, float]:
    """(median, min, max) milliseconds per call over options.iters repeats of one thunk."""
    got = time_interleaved({0: (thunk, sync, timer)}, warmup=options.warmup, iters=options.iters,
                           min_batch_ms=options.min_batch_ms, lead_in_ms=options.lead_in_ms)[0]
    if isinstance(got, Exception):
        raise got
    return got


def failure_status(exc: BaseException, caught: list) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if "Shared memory size limit" in text:
        return "unsupported: tiles exceed shared memory"
    if is_oom(exc):
        return "OOM"
    # PyTorch explains "No available kernel" in warnings; keep the first reason.
    reasons = [str(w.message).splitlines()[0] for w in caught if "kernel" in str(w.message).lower()]
    line = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
    if reasons:
        line = f"{line} ({reasons[0]})"
    return f"unsupported: {line[:160]}"


def release_memory() -> None:
    torch = sys.modules.get("torch")  # only a framework already in use holds cached memory
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
