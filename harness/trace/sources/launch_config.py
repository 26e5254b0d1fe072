"""Grid and block of each kernel of an nsys export (CUPTI records them with every kernel),
for the timeline's kernel arguments; the breakdown itself does not need them."""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

from harness.trace.profile import UNKNOWN
from harness.trace.sources.nsys import _unpack


def launch_configs(path: str | Path) -> dict[tuple[int, int], tuple[str, str]]:
    """(start ns, correlation id) -> ("gridXxYxZ", "blockXxYxZ") of every kernel of the export
    (``.sqlite`` or ``.sqlite.gz``); the key matches `KernelTable`'s start and correlation."""
    with tempfile.TemporaryDirectory() as tmp:
        db = sqlite3.connect(_unpack(Path(path), Path(tmp)))
        try:
            rows = db.execute(f"SELECT start, COALESCE(correlationId, {UNKNOWN}), gridX, gridY, gridZ, blockX, "
                              "blockY, blockZ FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall()
        finally:
            db.close()
    return {(start, corr): (f"{gx}x{gy}x{gz}", f"{bx}x{by}x{bz}") for start, corr, gx, gy, gz, bx, by, bz in rows}
