"""kernels.png: the kernel report's figure, category bars per profile and phase beside each
profile's top kernels (`harness.trace.render` writes the tables).

Importing matplotlib and rasterizing the figure take about as long as reading and
analysing a large profile, so `harness.report` draws in a child process (`Drawer`) forked
before the analysis starts: the child imports matplotlib while the parent reads the
profile, then draws while the parent writes the tables, and the report waits for the
figure only before the HTML page that embeds it.
"""

from __future__ import annotations

import multiprocessing
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from harness.common.results import atomic_path
from harness.common.spread import MAX_COLUMNS
from harness.trace.analyses.breakdown import TOP_N
from harness.trace.kernels import CATEGORY_COLORS, Category
from harness.trace.profile import ProfileError
from harness.trace.render_text import _unit, busy, short_names
from harness.trace.stats import Breakdown

DPI = 110


def plot(path: Path, bds: Sequence[Breakdown], top_n: int = TOP_N) -> None:
    """`kernel_figure` saved as a PNG (written whole or not at all)."""
    fig = kernel_figure(bds, top_n)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=DPI, format="png", pil_kwargs={"compress_level": 1})  # zlib level 6 is 1/5 of the draw


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


def _serve(conn) -> None:
    """The child: import matplotlib, then draw the one figure it is sent and say how it went."""
    for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # the parent's stop is the child's, silently
        signal.signal(stop, signal.SIG_DFL)
    try:
        import matplotlib.backends.backend_agg  # noqa: F401  (what savefig will need)
        import matplotlib.figure  # noqa: F401

        job = conn.recv()
        if job is not None:
            plot(*job)
        conn.send(None)
    except EOFError:  # the parent went away
        pass
    except Exception as exc:  # noqa: BLE001  (any failure reaches the parent as its one line)
        conn.send(f"{type(exc).__name__}: {exc}")


class Drawer:
    """Draws `plot` in a forked child (module docstring). Where forking is not safe (not
    Linux, or threads already running, as inside a test runner) it draws in this process
    when `wait` is called, with the same result."""

    def __init__(self) -> None:
        self._job: tuple | None = None
        self._conn = self._proc = None
        if sys.platform == "linux" and threading.active_count() == 1:
            ctx = multiprocessing.get_context("fork")
            self._conn, child = ctx.Pipe()
            self._proc = ctx.Process(target=_serve, args=(child,), daemon=True, name="kernels.png")
            self._proc.start()
            child.close()

    def draw(self, path: Path, bds: Sequence[Breakdown], top_n: int = TOP_N) -> None:
        """Start drawing `bds` into `path`; `wait` returns once it is written."""
        self._job = (Path(path), list(bds), top_n)
        if self._conn is not None:
            self._conn.send(self._job)

    def wait(self) -> Path:
        """The PNG's path once written; a failed drawing raises `ProfileError` with its cause."""
        if self._job is None:
            raise RuntimeError("Drawer.wait before Drawer.draw")
        if self._conn is None:
            plot(*self._job)
            return self._job[0]
        try:
            error = self._conn.recv()
        except EOFError:
            error = f"the drawing process ended with status {self._proc.exitcode if self._proc else '?'}"
        finally:
            self.close()
        if error:
            raise ProfileError(f"kernels.png could not be drawn ({error}); --no-plot skips it")
        return self._job[0]

    def close(self) -> None:
        """Stop the child if it is still there (an interrupted or failed report)."""
        if self._conn is not None:
            try:
                self._conn.send(None)
            except OSError:
                pass
            self._conn.close()
            self._conn = None
        if self._proc is not None:
            self._proc.join(timeout=5)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join()
            self._proc = None

    def __enter__(self) -> Drawer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
