"""kernels.png: the kernel report's figure, category bars per profile and phase beside each
profile's top kernels (`harness.trace.render` writes the tables)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from harness.common.spread import MAX_COLUMNS
from harness.trace.analyses.breakdown import TOP_N
from harness.trace.kernels import CATEGORY_COLORS, Category
from harness.trace.render_text import _unit, busy, short_names
from harness.trace.stats import Breakdown


def plot(path: Path, bds: Sequence[Breakdown], top_n: int = TOP_N) -> None:
    """`kernel_figure` saved as a PNG."""
    kernel_figure(bds, top_n).savefig(path, dpi=110)


def kernel_figure(bds: Sequence[Breakdown], top_n: int = TOP_N):
    """Stacked category bars per profile x phase (left) and each profile's top kernels of
    its step (right), for the first `MAX_COLUMNS` profiles (a rank set's tables hold the rest)."""
    from matplotlib.figure import Figure  # not pyplot: no GUI backend, and half the import time

    bds = bds[:MAX_COLUMNS]

    fig = Figure(figsize=(7 + 6 * len(bds), 6))
    axes = fig.subplots(1, 1 + len(bds), squeeze=False)
    ax = axes[0][0]
    bars = [(f"{bd.label}\n{ph}", p) for bd in bds for ph, p in bd.phases.items()]
    bottom = [0.0] * len(bars)
    for cat in Category:
        vals = [p.categories.get(cat.value, 0.0) / 1e6 for _, p in bars]
        if any(vals):
            ax.bar(range(len(bars)), vals, bottom=bottom, label=cat.value, color=CATEGORY_COLORS[cat])
            bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(range(len(bars)), [b for b, _ in bars], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel(f"{busy(bds)} ms per step")
    ax.set_title(f"{_unit(bds)} time by category")
    ax.legend(fontsize=7)
    for ax, bd in zip(axes[0][1:], bds):
        p = next(iter(bd.phases.values()))
        top = p.kernels[:top_n][::-1]
        ax.barh(range(len(top)), [k.ns_per_step / 1e6 for k in top],
                color=[CATEGORY_COLORS[Category(k.category)] for k in top])
        ax.set_yticks(range(len(top)), short_names([k.name for k in top], 45), fontsize=6)
        ax.set_xlabel("ms per step")
        ax.set_title(f"{bd.label}: top {_unit([bd])}s ({p.phase})")
    fig.tight_layout()
    return fig
