"""The parallel nsys reader against plain single-thread queries on every real export in tests/data."""

import functools
import gzip
import re
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from harness.trace.profile import GRAPH, KERNEL, MEMCPY, MEMSET, UNKNOWN, ProfileError
from harness.trace.sources import nsys, sqlite_load

DATA = Path(__file__).parent / "data"
EXPORTS = sorted(DATA.glob("**/*.sqlite.gz"))
GPU_TABLES = (("CUPTI_ACTIVITY_KIND_KERNEL", KERNEL), ("CUPTI_ACTIVITY_KIND_MEMCPY", MEMCPY),
              ("CUPTI_ACTIVITY_KIND_MEMSET", MEMSET), ("CUPTI_ACTIVITY_KIND_GRAPH_TRACE", GRAPH))
SPECIAL = {MEMCPY: "[CUDA memcpy]", MEMSET: "[CUDA memset]", GRAPH: nsys.GRAPH_NAME}


def _unpacked(path: Path, tmp: Path) -> sqlite3.Connection:
    out = tmp / path.name.removesuffix(".gz")
    with gzip.open(path) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return sqlite3.connect(out)


def _reference_kernels(db: sqlite3.Connection) -> list[tuple]:
    """(name, start, end, kind, device, stream, thread, launch, correlation) per GPU record,
    row by row: launch calls looked up in a dict by (process, correlationId), first call wins."""
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    strings = dict(db.execute("SELECT id, value FROM StringIds"))
    launch_ids = {i for i, s in strings.items() if re.match(r"cu.*(Launch|Memcpy|Memset)", s, re.I)}
    launches: dict[tuple[int, int], tuple[int, int]] = {}
    for tid, corr, start, name in db.execute("SELECT globalTid, correlationId, start, nameId "
                                             "FROM CUPTI_ACTIVITY_KIND_RUNTIME ORDER BY rowid"):
        if name in launch_ids:
            launches.setdefault((tid >> 24, corr), (tid, start))
    rows = []
    for table, kind in GPU_TABLES:
        if table not in tables:
            continue
        cols = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
        name = ("demangledName" if "demangledName" in cols else "shortName") if kind == KERNEL else "NULL"
        for nid, start, end, dev, stream, corr, pid in db.execute(
                f"SELECT {name}, start, end, deviceId, streamId, correlationId, globalPid FROM {table} ORDER BY rowid"):
            tid, launch = launches.get((pid >> 24, corr), (UNKNOWN, UNKNOWN))
            rows.append((strings[nid] if kind == KERNEL else SPECIAL[kind], start, end, kind, dev, stream, tid,
                         launch, UNKNOWN if corr is None else corr))
    return sorted(rows, key=lambda r: r[1])  # stable: ties keep table and rowid order


def _reference_api(db: sqlite3.Connection) -> list[tuple[str, int, int]]:
    rows = db.execute("SELECT s.value, COUNT(*), SUM(r.end - r.start) FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
                      "JOIN StringIds s ON r.nameId = s.id GROUP BY r.nameId")
    return sorted(((re.sub(r"_v\d+$", "", n), c, t) for n, c, t in rows), key=lambda a: -a[2])


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("path", EXPORTS, ids=lambda p: p.name)
def test_reader_matches_plain_queries(path, workers, tmp_path, monkeypatch):
    # small rowid ranges, so that every table of these fixtures is read in several parts
    monkeypatch.setattr(sqlite_load, "MIN_RANGE_ROWS", 700)
    monkeypatch.setattr(nsys, "ParallelReader", functools.partial(sqlite_load.ParallelReader, workers=workers))
    profile = nsys.read_sqlite(path, force=True)
    db = _unpacked(path, tmp_path)
    kt = profile.kernels
    want = _reference_kernels(db)
    assert len(kt) == len(want) > 500
    got = [np.array([kt.names[i] for i in kt.name])] + [getattr(kt, c) for c in
                                                        ("start", "end", "kind", "device", "stream", "thread",
                                                         "launch", "correlation")]
    for i, col in enumerate(got):
        assert col.tolist() == [w[i] for w in want], f"column {i}"
    assert (kt.launch != UNKNOWN).sum() > 0.6 * len(kt)  # the correlation join found most launches
    assert [(a.name, a.count, a.total_ns) for a in profile.api] == _reference_api(db)
    if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'NVTX_EVENTS'").fetchone():
        assert profile.ranges == []
        return
    ranges = db.execute("SELECT COUNT(*) FROM NVTX_EVENTS e LEFT JOIN NVTX_EVENTS d ON d.eventType = 75 "
                        "AND d.domainId = e.domainId WHERE e.eventType IN (59, 60) AND e.end IS NOT NULL "
                        "AND COALESCE(e.text, (SELECT value FROM StringIds WHERE id = e.textId)) IS NOT NULL "
                        "AND d.text IS NULL").fetchone()[0]
    assert len(profile.ranges) == ranges


def test_null_in_an_integer_column_is_named(tmp_path):
    db = _unpacked(DATA / "torch_tiny_attn" / "torch_tiny_attn.sqlite.gz", tmp_path)
    db.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET globalPid = NULL WHERE rowid = 7")
    db.commit()
    db.close()
    with pytest.raises(ProfileError, match=r"CUPTI_ACTIVITY_KIND_KERNEL\.globalPid: 1 of \d+ values are NULL"):
        nsys.read_sqlite(tmp_path / "torch_tiny_attn.sqlite")


def test_ranges_split_a_table_in_rowid_order(tmp_path, monkeypatch):
    monkeypatch.setattr(sqlite_load, "MIN_RANGE_ROWS", 1000)
    db = sqlite3.connect(tmp_path / "t.sqlite")
    db.execute("CREATE TABLE t (a INTEGER, b INTEGER)")
    db.executemany("INSERT INTO t VALUES (?, ?)", [(i, -(i % 7) * 2**62 // 3) for i in range(5000)])
    db.commit()
    with sqlite_load.ParallelReader(tmp_path / "t.sqlite", workers=4) as reader:
        reader_ranges = reader.per_range("t", lambda db, rowids: rowids)
        a, b = reader.columns("t", ["a", "b"], "a % 2 = 0")()
    assert [r.result() for r in reader_ranges] == [f"rowid >= {a} AND rowid < {b}" for a, b in
                                                   ((1, 1251), (1251, 2501), (2501, 3751), (3751, 5001))]
    assert a.tolist() == list(range(0, 5000, 2))
    assert b.tolist() == [-(i % 7) * 2**62 // 3 for i in range(0, 5000, 2)]  # 64-bit values exact
