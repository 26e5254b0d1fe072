"""Kernel-launch calls per phase, read from an nsys SQLite export: the nsys source's
`launches` (`harness.trace.sources.registry`), which `harness.diffs` reads through
`harness.trace.sources.load.launches_of`.

The host side of a phase is its range time not covered by GPU work; how many launch
calls it made and how long each took says how much of that is launch overhead. The
calls are the CUDA runtime and driver API records (``CUPTI_ACTIVITY_KIND_RUNTIME``)
whose name contains "Launch" (``cudaLaunchKernel``, ``cuLaunchKernelEx``,
``cuGraphLaunch``...), counted when they start inside a measured range of the phase:
the launching thread does not matter (PyTorch launches backward kernels from its
autograd thread, inside the ``backward`` range in time).
"""

from __future__ import annotations

import gzip
import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness.trace.profile import PHASES, STEP_RANGES, WARMUP

NVTX_PUSH_POP, NVTX_START_END = 59, 60


@dataclass(frozen=True)
class Launches:
    """Launch calls of one phase, per measured step."""

    per_step: float
    ns_per_launch: float  # mean host time inside one launch call


def _rows(db: sqlite3.Connection, sql: str) -> list[tuple]:
    try:
        return list(db.execute(sql))
    except sqlite3.OperationalError:  # a table or column this export lacks
        return []


def _count(db: sqlite3.Connection) -> dict[str, Launches]:
    ranges = _rows(db, "SELECT COALESCE(n.text, s.value), n.start, n.end FROM NVTX_EVENTS n "
                       "LEFT JOIN StringIds s ON n.textId = s.id "
                       f"WHERE n.eventType IN ({NVTX_PUSH_POP}, {NVTX_START_END}) AND n.end IS NOT NULL")
    calls = sorted(_rows(db, "SELECT r.start, r.end FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
                             "JOIN StringIds s ON r.nameId = s.id WHERE s.value LIKE '%Launch%'"))
    if not calls:
        return {}
    warmups = [(s, e) for name, s, e in ranges if name == WARMUP]
    measured = [(name, s, e) for name, s, e in ranges
                if name in (*STEP_RANGES, *PHASES) and not any(ws <= s and e <= we for ws, we in warmups)]
    fused = [(s, e) for name, s, e in measured if name == "fused_step"]
    out = {}
    for phase in (*STEP_RANGES, *PHASES):
        own = [(s, e) for name, s, e in measured if name == phase]
        if phase == "step":  # a step that only wraps a fused step is the fused step's
            own = [(s, e) for s, e in own if not any(s <= fs and fe <= e for fs, fe in fused)]
        inside = [(cs, ce) for cs, ce in calls if any(s <= cs <= e for s, e in own)]
        if own and inside:
            out[phase] = Launches(len(inside) / len(own), sum(ce - cs for cs, ce in inside) / len(inside))
    return out


def launches_per_phase(path: str | Path) -> dict[str, Launches]:
    """Launch calls per phase of an nsys export (``.sqlite`` or ``.sqlite.gz``); empty
    when the export has no runtime records (profiled without CUDA API tracing), or for an
    ``.nsys-rep`` without its export beside it (``X.sqlite``, written when it was read)."""
    path = Path(path)
    if path.name.endswith(".nsys-rep"):
        path = path.with_suffix(".sqlite")
        if not path.exists():
            return {}
    with tempfile.TemporaryDirectory() as tmp:
        if path.name.endswith(".gz"):
            plain = Path(tmp) / "profile.sqlite"
            plain.write_bytes(gzip.decompress(path.read_bytes()))
            path = plain
        db = sqlite3.connect(path)
        try:
            return _count(db)
        finally:
            db.close()
