"""Summaries of repeated timings."""

from __future__ import annotations

import statistics


def summarize(times_ms: list[float]) -> dict[str, float]:
    """mean, std (sample), median, min, max of a list of milliseconds."""
    if not times_ms:
        raise ValueError("no timings to summarize")
    return {
        "mean_ms": statistics.fmean(times_ms),
        "std_ms": statistics.stdev(times_ms) if len(times_ms) > 1 else 0.0,
        "median_ms": statistics.median(times_ms),
        "min_ms": min(times_ms),
        "max_ms": max(times_ms),
        "n": len(times_ms),
    }
