"""A figure over many ranks (or columns) in a few numbers: min, median, p90, max, and the
outliers named by one stated rule, so that a table stays as wide at 512 ranks as at 9.

Up to `MAX_COLUMNS` columns a report shows one column each; beyond, `spread` of each row.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

import numpy as np

MAX_COLUMNS = 8  # up to this many ranks, one column each; beyond, the distribution
MAD_K = 3.0  # an outlier lies more than MAD_K median absolute deviations from the median ...
MIN_REL = 0.05  # ... and more than this share of the median from it (ranks jitter by a few per cent)
NAMED = 5  # outliers named in a cell; the rest counted
HEADER = ("min", "median", "p90", "max", "outliers")
RULE = (f"Beyond {MAX_COLUMNS} ranks a row gives the distribution over the ranks (min, median, p90, max); outliers: "
        f"ranks more than {MAD_K:g} x the median absolute deviation (MAD) from the median and more than "
        f"{MIN_REL:.0%} of it away (+ above, - below, slowest first); ranks.csv holds every rank's figures.")


def spread(values: Mapping[int, float]) -> dict:
    """min, median, p90 (linear interpolation), max of `values` (rank -> value), and its
    outliers (module rule): rank -> signed distance from the median, farthest first."""
    v = np.array(list(values.values()), dtype=float)
    med = float(statistics.median(v.tolist()))
    mad = float(statistics.median(np.abs(v - med).tolist()))
    far = {r: x - med for r, x in values.items() if abs(x - med) > MAD_K * mad and abs(x - med) > MIN_REL * abs(med)}
    return {"min": float(v.min()), "median": med, "p90": float(np.percentile(v, 90)), "max": float(v.max()),
            "outliers": dict(sorted(far.items(), key=lambda kv: -kv[1]))}


def outlier_cell(outliers: Mapping[int, float], prefix: str = "rank") -> str:
    """The outliers of a `spread` in one cell: ``rank5 +, rank9 -`` and how many more."""
    if not outliers:
        return "none"
    named = [f"{prefix}{r} {'+' if d > 0 else '-'}" for r, d in list(outliers.items())[:NAMED]]
    more = f" and {len(outliers) - NAMED} more" if len(outliers) > NAMED else ""
    return ", ".join(named) + more


def spread_cells(values: Mapping[int, float], fmt: str = "{:.3f}", prefix: str = "rank") -> list[str]:
    """A table row's cells for `values`: min, median, p90, max formatted, then the outliers."""
    s = spread(values)
    return [*(fmt.format(s[k]) for k in HEADER[:4]), outlier_cell(s["outliers"], prefix)]


def capped(lines: Sequence[str], n: int, what: str) -> list[str]:
    """The first `n` of `lines`, and one line saying how many more `what` the full report has."""
    if len(lines) <= n:
        return list(lines)
    return [*lines[:n], f"- ... and {len(lines) - n} more {what} (report.html, or `--detail full`)"]
