"""Integer columns of large SQLite tables, read on a pool of threads.

An nsys export of a few training steps holds hundreds of thousands of kernel records and
over a million CUDA API records. Fetched row by row, each value becomes a Python object
under the GIL, which takes longer than the whole analysis. Here SQLite does the
conversion instead: a column comes back as one ``group_concat`` string, built inside
``sqlite3_step`` (which releases the GIL) and parsed by NumPy. A table is read as rowid
ranges, one query each, on a pool of ``os.cpu_count()`` threads (at most `MAX_WORKERS`),
each with its own read-only connection; on one core the same code runs serially. Ranges are concatenated
in rowid order, so the result is the same as one query over the whole table.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import numpy as np

from harness.trace.profile import ProfileError

T = TypeVar("T")
# Rows per query: smaller ranges cost more in per-query overhead than parallelism saves;
# larger ones hold long strings (about 20 bytes a value) in memory at once.
MIN_RANGE_ROWS = 20_000
MAX_RANGE_ROWS = 1_000_000
# Each thread holds its own connection, page cache and allocator arena: beyond a few
# threads memory grows while the reads (a fraction of the analysis by then) barely shrink.
MAX_WORKERS = 8


def connect(path: Path) -> sqlite3.Connection:
    """A read-only connection to the SQLite file `path`, usable from any one thread at a time."""
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)


class ParallelReader:
    """Queries on a pool of threads, each thread with its own read-only connection to `path`;
    `db` is the caller's own connection.

    Use as a context manager: leaving it waits for the queries and closes the connections."""

    def __init__(self, path: Path, workers: int | None = None) -> None:
        self.path = path
        self.workers = max(1, workers or min(os.cpu_count() or 1, MAX_WORKERS))
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self.db = connect(path)
        self._pool = ThreadPoolExecutor(self.workers)

    def __enter__(self) -> ParallelReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        for db in (self.db, *self._connections):
            db.close()

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = connect(self.path)
            with self._lock:
                self._connections.append(db)
        return db

    def query(self, sql: str) -> Future[list[tuple]]:
        """All rows of `sql`, fetched on a worker thread."""
        return self._pool.submit(lambda: self._db().execute(sql).fetchall())

    def per_range(self, table: str, read: Callable[[sqlite3.Connection, str], T]) -> list[Future[T]]:
        """`read(db, condition)` on each rowid range of `table`, in rowid order, where
        `condition` is the SQL expression selecting the range's rows."""
        # one aggregate per query: SQLite reads MIN or MAX alone off the b-tree, both together by a scan
        lo, hi = self.db.execute(f"SELECT (SELECT MIN(rowid) FROM {table}), "
                                 f"(SELECT MAX(rowid) FROM {table})").fetchone()
        if lo is None:
            return []
        rows = hi - lo + 1  # nsys writes rowids densely: the span is the row count
        n = max(-(-rows // MAX_RANGE_ROWS), min(self.workers, rows // MIN_RANGE_ROWS), 1)
        edges = [lo + rows * i // n for i in range(n + 1)]
        return [self._pool.submit(lambda a=a, b=b: read(self._db(), f"rowid >= {a} AND rowid < {b}"))
                for a, b in zip(edges[:-1], edges[1:])]

    def columns(self, table: str, exprs: Sequence[str], where: str = "1") -> Callable[[], list[np.ndarray]]:
        """Start reading the integer expressions `exprs` over the rows of `table` that match
        `where`; the returned function waits and gives one int64 array per expression."""
        parts = self.per_range(table, lambda db, rowids: _read_columns(db, table, exprs, f"{rowids} AND ({where})"))

        def result() -> list[np.ndarray]:
            done = [f.result() for f in parts]
            if not done:
                return [np.empty(0, np.int64) for _ in exprs]
            return [np.concatenate(col) for col in zip(*done)]
        return result


def _read_columns(db: sqlite3.Connection, table: str, exprs: Sequence[str], where: str) -> list[np.ndarray]:
    """The integer expressions `exprs` over the rows of `table` matching `where`, one int64
    array each (in this thread)."""
    sql = f"SELECT COUNT(*), {', '.join(f'group_concat({e})' for e in exprs)} FROM {table} WHERE {where}"
    count, *texts = db.execute(sql).fetchone()
    if not count:
        return [np.empty(0, np.int64) for _ in exprs]
    cols = [np.fromstring(text or "", np.int64, sep=",") for text in texts]
    for expr, col in zip(exprs, cols):
        if len(col) != count:  # group_concat skips NULLs; fromstring stops at a non-integer
            raise ProfileError(f"{table}.{expr}: {count - len(col)} of {count} values are NULL or not integers; "
                               "is this an export written by `nsys export --type sqlite`?")
    return cols
