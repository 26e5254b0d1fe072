"""kernels.png: the kernel report's figure, category bars per profile and phase beside each
profile's top kernels (`harness.reports.breakdown` writes the tables).

Importing matplotlib and rasterizing the figure take about as long as reading and
analysing a large profile, so `harness.report` draws in a child process (`Drawer`) forked
before the analysis starts: the child imports matplotlib while the parent reads the
profile, then draws once the breakdowns are known, while the parent computes the rest and
writes the tables; the report waits for the figure only before the HTML page that embeds it.
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
from harness.reports.breakdown_text import _unit, busy, short_names
from harness.trace.analyses.breakdown import TOP_N
from harness.trace.kernels import CATEGORY_COLORS, Category
from harness.trace.profile import ProfileError
from harness.trace.stats import Breakdown

DPI = 110


def plot(path: Path, bds: Sequence[Breakdown], top_n: int = TOP_N) -> None:
    """`kernel_figure` saved in the format `path`'s suffix names (written whole or not at all)."""
    fig = kernel_figure(bds, top_n)
    png = Path(path).suffix.lower() == ".png"
    with atomic_path(path) as tmp:  # zlib's level 6 takes a fifth of the drawing time, level 1 a few percent
        fig.savefig(tmp, dpi=DPI, **({"pil_kwargs": {"compress_level": 1}} if png else {}))


# The layout is set in inches from the labels' lengths rather than measured by
# `tight_layout`, which renders every text once more (a third of the drawing time) and
# still clipped long kernel names. A character of DejaVu Sans averages under 0.65 em.
_EM = 0.65 / 72  # inches per point of font size, per character
_PANEL = 6.5  # inches per panel


def _text_inches(texts: Sequence[str], size: float) -> float:
    """Width of the longest line of `texts` at font `size`, in inches (an upper estimate)."""
    return max((len(line) for t in texts for line in t.split("\n")), default=0) * size * _EM


def kernel_figure(bds: Sequence[Breakdown], top_n: int = TOP_N):
    """Stacked category bars per profile x phase (left) and each profile's top kernels of
    its step (right), for the first `MAX_COLUMNS` profiles (a rank set's tables hold the rest)."""
    from matplotlib.figure import Figure  # not pyplot: no GUI backend, and half the import time

    bds = bds[:MAX_COLUMNS]
    clip = lambda t: t if len(t) <= 30 else t[:29] + "…"  # noqa: E731
    bars = [(f"{clip(bd.label)}\n{clip(ph)}", p) for bd in bds for ph, p in bd.phases.items()]
    tops = [next(iter(bd.phases.values())) for bd in bds]
    names = [short_names([k.name for k in p.kernels[:top_n][::-1]], 45) for p in tops]
    width, height, top = _PANEL * (1 + len(bds)), 6.0, 0.45
    fig = Figure(figsize=(width, height))

    def axes(left: float, bottom: float, right: float):  # inches from the panel's left edge
        return fig.add_axes((left / width, bottom / height, (right - left) / width, 1 - (bottom + top) / height))

    # rotated 60 degrees: the labels' height is their width * sin 60 plus two lines * cos 60
    ax = axes(0.8, 0.3 + _text_inches([b for b, _ in bars], 7) * 0.87 + 2 * 7 * 1.2 / 72 * 0.5, _PANEL - 0.2)
    bottom = [0.0] * len(bars)
    for cat in Category:
        vals = [p.categories.get(cat.value, 0.0) / 1e6 for _, p in bars]
        if any(vals):
            ax.bar(range(len(bars)), vals, bottom=bottom, label=cat.value, color=CATEGORY_COLORS[cat])
            bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(range(len(bars)), [b for b, _ in bars], rotation=60, ha="right", rotation_mode="anchor",
                  fontsize=7)
    ax.set_ylabel(f"{busy(bds)} ms per step")
    ax.set_title(f"{_unit(bds)} time by category")
    ax.legend(fontsize=7)
    for i, (bd, p, labels) in enumerate(zip(bds, tops, names), 1):
        x0 = _PANEL * i
        ax = axes(x0 + 0.25 + _text_inches(labels, 6), 0.6, x0 + _PANEL - 0.25)
        top_k = p.kernels[:top_n][::-1]
        ax.barh(range(len(top_k)), [k.ns_per_step / 1e6 for k in top_k],
                color=[CATEGORY_COLORS[Category(k.category)] for k in top_k])
        ax.set_yticks(range(len(top_k)), labels, fontsize=6)
        ax.set_xlabel("ms per step")
        ax.set_title(f"{bd.label}: top {_unit([bd])}s ({p.phase})")
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

    @property
    def drawing(self) -> bool:
        """Whether `draw` was called."""
        return self._job is not None

    def wait(self) -> Path:
        """The PNG's path once written; a failed drawing raises `ProfileError` with its cause."""
        if self._job is None:
            raise RuntimeError("Drawer.wait before Drawer.draw")
        if self._conn is None:
            try:
                plot(*self._job)
            except Exception as exc:  # noqa: BLE001  (the same one line as from the child)
                raise ProfileError(f"kernels.png could not be drawn ({type(exc).__name__}: {exc}); "
                                   "--no-plot skips it") from exc
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
