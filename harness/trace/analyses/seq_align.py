"""Order-preserving matching of a profile's kernels to a schedule's instructions.

Kernels run in the order their program schedules them, except where concurrent work on
several streams starts out of order; some instructions launch no kernel a profile shows,
and a kernel's name may fit several instructions (one compiled kernel reused by identical
instructions). `align` finds a longest order-preserving matching (the longest common
subsequence of the two, where a kernel accepts a set of instructions) in a band around
the diagonal, so it costs O(n * band) rather than O(n * m), and keeps a kernel's match
only where every longest matching agrees on its label; `repair` places the kernels that
started out of order. Neither guesses: a kernel they cannot place unambiguously stays
unmatched.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

WINDOW = 16  # the band's width beyond the kernel/anchor count difference, and the reorder window
_NEG = -(1 << 30)


def _lcs_table(accepts: Sequence[np.ndarray], m: int, dlo: int, dhi: int) -> np.ndarray:
    """The banded longest-common-subsequence table of kernels against anchors: row i,
    column d - dlo holds how many of the first i kernels can be matched, in order, to the
    first i + d anchors (kernel i accepting anchor a where a is in ``accepts[i]``); cells off
    the table (i + d outside 0..m) hold a large negative number. One vectorized row per
    kernel: O(n * band)."""
    d = np.arange(dlo, dhi + 1)
    table = np.full((len(accepts) + 1, len(d)), _NEG, np.int32)
    table[0, (d >= 0) & (d <= m)] = 0
    for i, acc in enumerate(accepts, start=1):
        hit = np.zeros(len(d), np.int32)
        hit[acc[(acc >= i - 1 + dlo) & (acc <= i - 1 + dhi)] - (i - 1) - dlo] = 1  # anchor a is j = a + 1
        prev = table[i - 1]
        row = np.maximum.accumulate(np.maximum(prev + hit, np.append(prev[1:], _NEG)))
        row[(i + d < 0) | (i + d > m)] = _NEG
        table[i] = row
    return table


def align(accepts: Sequence[np.ndarray], m: int, layer_of: np.ndarray) -> np.ndarray:
    """The anchor of each kernel (-1: none) in a longest order-preserving matching of the
    kernels to the anchors, within a band of `WINDOW` around the diagonal from the first to
    the last pair. A kernel keeps its anchor only where every longest matching that matches
    it gives it an anchor of the same layer: a kernel missing from a run of reused fusions
    of several layers leaves the others of the run unlabelled rather than guessed."""
    n = len(accepts)
    matched = np.full(n, -1, np.int64)
    if not n or not m:
        return matched
    dlo, dhi = min(0, m - n) - WINDOW, max(0, m - n) + WINDOW
    fwd = _lcs_table(accepts, m, dlo, dhi)
    bwd = _lcs_table([m - 1 - acc[::-1] for acc in accepts[::-1]], m, dlo, dhi)  # reversed: the suffixes
    best = fwd[n, m - n - dlo]
    i, j = n, m
    while i > 0 and j > 0:  # trace one longest matching back from its end; of two kernels
        d = j - i - dlo  # that fit one anchor, the earlier gets it (a reordered one is repaired)
        if d + 1 < fwd.shape[1] and fwd[i, d] == fwd[i - 1, d + 1]:
            i -= 1
        elif fwd[i, d] == fwd[i - 1, d] + 1 and np.any(accepts[i - 1] == j - 1):
            matched[i - 1] = j - 1
            i, j = i - 1, j - 1
        else:
            j -= 1
    for i, acc in enumerate(accepts):  # the anchors kernel i has in some longest matching
        d = acc - i
        acc, d = acc[(d >= dlo) & (d <= dhi)], d[(d >= dlo) & (d <= dhi)]
        optimal = acc[fwd[i, d - dlo] + 1 + bwd[n - 1 - i, (m - n) - d - dlo] == best]
        if len(np.unique(layer_of[optimal])) > 1:
            matched[i] = -1
    return matched


def repair(accepts: Sequence[np.ndarray], matched: np.ndarray, m: int, layer_of: np.ndarray) -> np.ndarray:
    """Anchors for the kernels the alignment left out where concurrent kernels started out
    of schedule order: a free anchor accepting the kernel within `WINDOW` anchors of its
    matched neighbours' span, the nearest one, where all such candidates share one layer."""
    out, free = np.full(len(accepts), -1, np.int64), np.ones(m, bool)
    free[matched[matched >= 0]] = False
    left = np.maximum.accumulate(np.where(matched >= 0, matched, -1))
    right = np.minimum.accumulate(np.where(matched >= 0, matched, m)[::-1])[::-1]
    for i in np.flatnonzero(matched < 0):
        acc = accepts[i]
        cands = acc[free[acc] & (acc >= left[i] - WINDOW) & (acc <= right[i] + WINDOW)]
        if len(cands) and len(np.unique(layer_of[cands])) == 1:
            a = cands[np.argmin(np.maximum(left[i] - cands, cands - right[i]))]
            out[i], free[a] = a, False
    return out
