"""Summaries of repeated timings: robust centre and spread, and the steps that stand out.

A step's median and its p10-p90 range describe a phase; a standard deviation does not,
because one slow step (a garbage collection, a recompilation) dominates it. Steps beyond
Tukey's far-out fence (more than 3 IQR outside the quartiles, and more than 10% from the
median, so sub-percent jitter is not called an outlier) are listed with their index
rather than folded into the figures. Mean and standard deviation stay in the record for
those who want them.
"""

from __future__ import annotations

import statistics

import numpy as np

FAR_OUT_IQR = 3.0
MIN_OUTLIER_DEVIATION = 0.10  # relative to the median
# A step whose p90 exceeds its p10 by more than this factor was timed on a machine busy with
# other work: the backends did not run under the same conditions, so their ratios mislead.
NOISY_SPREAD = 1.5


def outliers(times_ms: list[float]) -> list[dict]:
    """The steps beyond the far-out fence, as ``{"index", "ms", "x_median"}``."""
    if len(times_ms) < 4:
        return []
    t = np.asarray(times_ms, dtype=float)
    q1, med, q3 = np.percentile(t, [25, 50, 75])
    fence = FAR_OUT_IQR * (q3 - q1)
    far = (t > q3 + fence) | (t < q1 - fence)
    far &= np.abs(t - med) > MIN_OUTLIER_DEVIATION * med
    return [{"index": int(i), "ms": float(t[i]), "x_median": float(t[i] / med) if med else None}
            for i in np.flatnonzero(far)]


def summarize(times_ms: list[float]) -> dict:
    """median, p10, p90, quartiles and IQR, min, max, mean, sample std, n and outliers."""
    if not times_ms:
        raise ValueError("no timings to summarize")
    t = np.asarray(times_ms, dtype=float)
    p10, q1, med, q3, p90 = np.percentile(t, [10, 25, 50, 75, 90])
    return {
        "median_ms": float(med),
        "p10_ms": float(p10),
        "p90_ms": float(p90),
        "q1_ms": float(q1),
        "q3_ms": float(q3),
        "iqr_ms": float(q3 - q1),
        "min_ms": float(t.min()),
        "max_ms": float(t.max()),
        "mean_ms": statistics.fmean(times_ms),
        "std_ms": statistics.stdev(times_ms) if len(times_ms) > 1 else 0.0,
        "n": len(times_ms),
        "outliers": outliers(times_ms),
    }


def cell(rec: dict, digits: int = 3) -> str:
    """``median (p10-p90)`` of a summary, for tables; records written before p10/p90 were
    kept show ``median ± std``."""
    f = f".{digits}f"
    if "p10_ms" not in rec:
        return f"{rec['median_ms']:{f}} ± {rec['std_ms']:{f}}"
    return f"{rec['median_ms']:{f}} ({rec['p10_ms']:{f}}-{rec['p90_ms']:{f}})"


def figure(value: float | None, decimals: int = 2) -> str:
    """A positive figure for a table with `decimals` places, or with two significant digits
    where those places would round it to zero (a CPU's TFLOP/s: "0.0023", not "0.00");
    "-" for none or zero."""
    if not value:
        return "-"
    return f"{value:.{decimals}f}" if round(value, decimals) else f"{value:.2g}"


def times_the_median(ratio: float | None) -> str:
    """An outlier step's time against the median in words: "7.3x the median", or for one
    below it "120x faster than the median" (not "0.0x the median")."""
    if ratio is None:
        return "the median is 0 ms"
    if ratio == 0:
        return "0x the median"
    return f"{ratio:.1f}x the median" if ratio >= 1 else f"{1 / ratio:.1f}x faster than the median"
