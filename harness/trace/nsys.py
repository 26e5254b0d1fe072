"""Nsight Systems: the `nsys profile` command, SQLite export, and reading the export.

The reader returns the profile model of `harness.trace.profile`, as the framework-profiler
fallback (`harness.trace.framework_profile`) does, so both feed the same analysis
(`harness.trace.breakdown`).

Reading uses these tables of the SQLite export (missing optional tables are skipped):
``CUPTI_ACTIVITY_KIND_KERNEL`` (required), ``CUPTI_ACTIVITY_KIND_MEMCPY``/``MEMSET``,
``CUPTI_ACTIVITY_KIND_GRAPH_TRACE`` (whole-graph records), ``CUPTI_ACTIVITY_KIND_RUNTIME``
(which thread launched each kernel and when, by correlationId; the CUDA API summary),
``NVTX_EVENTS`` (eventType 59 push/pop and 60 start/end ranges of the default domain;
75 names a domain),
``StringIds`` and ``DIAGNOSTIC_EVENT`` (the importer's own warnings and errors).
"""

from __future__ import annotations

import gzip
import itertools
import os
import re
import shutil
import sqlite3
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from harness.trace.attribution import TID_PROCESS_SHIFT
from harness.trace.profile import (
    BACKENDS,
    GRAPH,
    KERNEL,
    MEMCPY,
    MEMSET,
    UNKNOWN,
    ApiStat,
    KernelTable,
    Profile,
    ProfileError,
    Range,
    label_from_path,
)

# --cuda-graph-trace=node: XLA replays steps as CUDA graphs, which nsys otherwise records
# as one graph-level event each, hiding every kernel of the measured steps.
TRACE_FLAGS = ("--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none", "--cuda-graph-trace=node")
# XLA's own NVTX ranges (domain "TSL") break the nsys importer ("Cannot find string for
# an exterior index"), which then drops every kernel record; the harness's ranges live
# in the default domain, so excluding TSL keeps kernels and phase ranges.
JAX_FLAGS = ("--nvtx-domain-exclude=TSL",)
GRAPH_NAME = "[CUDA graph: whole graph, kernels not traced]"
GRAPH_NOTE = ("CUDA graphs were traced as whole graphs: {count} graph launches, {ms:.3f} ms of GPU time in "
              "`{name}` rows; the per-kernel tables describe only the kernels launched outside graphs. "
              "To see the kernels inside the graphs, profile again with `nsys profile --cuda-graph-trace=node`")
# The API calls a summary groups together (first match wins), by the function's name
# without its `_vNNNN` version suffix.
API_GROUPS = (
    ("synchronization", re.compile(r"Synchronize|cuStreamQuery|cudaStreamQuery|cudaEventQuery")),
    ("graph", re.compile(r"Graph|StreamIsCapturing|StreamGetCaptureInfo|StreamBeginCapture|StreamEndCapture")),
    ("launch", re.compile(r"Launch")),
    ("memcpy", re.compile(r"[Mm]emcpy")),
    ("memset", re.compile(r"[Mm]emset")),
    ("allocation", re.compile(r"Malloc|Free|MemAlloc|MemFree|MemPool|HostAlloc|HostRegister|MemCreate"
                              r"|MemRelease|MemMap")),
)
MISSING_SHARE = 0.01  # kernel launches without a kernel record above this share: records were lost
NVTX_PUSH_POP, NVTX_START_END, NVTX_DOMAIN_CREATE = 59, 60, 75
_SQLITE_MAGIC = b"SQLite format 3\x00"


def find_nsys(explicit: str | None = None) -> str:
    """The nsys binary: `explicit`, else ``$NSYS``, else ``nsys`` on PATH."""
    candidate = explicit or os.environ.get("NSYS") or shutil.which("nsys")
    if candidate and Path(candidate).is_file():
        return candidate
    where = f" ({candidate!r} is not a file)" if candidate else ""
    raise ProfileError(
        f"nsys not found{where}: install Nsight Systems and put `nsys` on PATH, or set "
        "NSYS=/path/to/nsys; without nsys, profile with --profile (framework profiler)"
    )


def profile_command(
    backend: str, output: str | Path, program: Sequence[str], nsys: str | None = None
) -> list[str]:
    """The `nsys profile` argv that runs `program` and writes ``<output>.nsys-rep``."""
    if backend.split("-")[0] not in BACKENDS:  # torch-compile[-cg] take torch's flags
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    return [
        find_nsys(nsys),
        "profile",
        *TRACE_FLAGS,
        *(JAX_FLAGS if backend == "jax" else ()),
        "--force-overwrite=true",
        f"--output={output}",
        *program,
    ]


def export_sqlite(report: str | Path, nsys: str | None = None) -> Path:
    """Export ``X.nsys-rep`` to ``X.sqlite`` beside it (overwriting) and return its path."""
    report = Path(report)
    out = report.with_suffix(".sqlite")
    cmd = [find_nsys(nsys), "export", "--type", "sqlite", "--force-overwrite", "true",
           "--output", str(out), str(report)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0 or not out.is_file():
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ProfileError(f"`nsys export` failed on {report}: {tail[0]} (is it an .nsys-rep "
                           "written by this nsys version or older?)")
    return out


def _tables(db: sqlite3.Connection) -> set[str]:
    return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in db.execute(f"PRAGMA table_info({table})")}


def _diagnostics(db: sqlite3.Connection, tables: set[str]) -> list[str]:
    """Errors nsys recorded while importing (``DIAGNOSTIC_EVENT``), one line each.

    The importer's failures arrive as warnings whose text starts "Error when processing
    events", with the cause on a ``tag_message`` line; errors proper have severity 3."""
    if "DIAGNOSTIC_EVENT" not in tables:
        return []
    out: list[str] = []
    rows = db.execute("SELECT severity, text FROM DIAGNOSTIC_EVENT WHERE severity = 3 "
                      "OR text LIKE '%error%'")
    for _, text in rows:
        cause = re.search(r"tag_message\*?\]\s*=\s*(.+)", text or "")
        line = (text or "").strip().splitlines()[0].rstrip(":") if text else ""
        line = f"{line}: {cause.group(1).strip()}" if cause else line
        if line and line not in out:
            out.append(line)
    return out


def _int_rows(db: sqlite3.Connection, sql: str, width: int) -> np.ndarray:
    """The rows of `sql` (`width` integer columns, no NULLs) as an int64 array of shape (n, width),
    streamed from the cursor without a Python object per row kept."""
    flat = np.fromiter(itertools.chain.from_iterable(db.execute(sql)), np.int64)
    return flat.reshape(-1, width)


def _launches(db: sqlite3.Connection, tables: set[str]) -> np.ndarray:
    """(process, correlationId, globalTid, start) of every API call that puts work on the GPU,
    sorted by (process, correlationId): the launch side of the CUPTI correlation."""
    if "CUPTI_ACTIVITY_KIND_RUNTIME" not in tables:
        return np.empty((0, 4), np.int64)
    ids = [str(i) for i, in db.execute(
        "SELECT id FROM StringIds WHERE value LIKE 'cu%Launch%' OR value LIKE 'cu%Memcpy%' "
        "OR value LIKE 'cu%Memset%' OR value LIKE 'cu%Graph%Launch%'")]
    rows = _int_rows(db, "SELECT globalTid, correlationId, globalTid, start FROM CUPTI_ACTIVITY_KIND_RUNTIME "
                         f"WHERE nameId IN ({','.join(ids)})", 4)
    rows[:, 0] >>= TID_PROCESS_SHIFT
    return rows[np.lexsort((rows[:, 1], rows[:, 0]))]


def _match(launches: np.ndarray, process: np.ndarray | None, correlation: np.ndarray) -> tuple[np.ndarray, ...]:
    """(thread, launch start) of each GPU record's launch call, UNKNOWN where none matches.
    correlationIds are unique per process only: the process must match too, where known."""
    n = len(correlation)
    thread, start = np.full(n, UNKNOWN, np.int64), np.full(n, UNKNOWN, np.int64)
    if not len(launches):
        return thread, start
    if process is None:  # an export without the process column: correlation ids alone
        keys, want = launches[:, 1], correlation
        order = np.argsort(keys, kind="stable")
        keys, rows = keys[order], launches[order]
    else:
        keys = launches[:, 0] * (1 << 32) + launches[:, 1]
        want, rows = process * (1 << 32) + correlation, launches
    at = np.minimum(np.searchsorted(keys, want), len(keys) - 1)
    hit = keys[at] == want
    thread[hit], start[hit] = rows[at[hit], 2], rows[at[hit], 3]
    return thread, start


def _kernels(db: sqlite3.Connection, tables: set[str]) -> KernelTable:
    """Kernels, memcpys, memsets and whole-graph records as columns, names fetched once each."""
    kcols = _columns(db, "CUPTI_ACTIVITY_KIND_KERNEL")
    name_col = "demangledName" if "demangledName" in kcols else "shortName"
    launches = _launches(db, tables)
    blocks, names_sql = [], {"CUPTI_ACTIVITY_KIND_KERNEL": f"{name_col}"}
    for table, kind in (("CUPTI_ACTIVITY_KIND_KERNEL", KERNEL), ("CUPTI_ACTIVITY_KIND_MEMCPY", MEMCPY),
                        ("CUPTI_ACTIVITY_KIND_MEMSET", MEMSET), ("CUPTI_ACTIVITY_KIND_GRAPH_TRACE", GRAPH)):
        if table not in tables:
            continue
        pid = "globalPid" in _columns(db, table)
        # a negative name id marks the kind of a record without a name; string ids are >= 0
        rows = _int_rows(db, f"SELECT {names_sql.get(table, -1 - kind)}, start, end, deviceId, streamId, "
                             f"COALESCE(correlationId, -1), {'globalPid' if pid else 0} FROM {table}", 7)
        thread, start = _match(launches, rows[:, 6] >> TID_PROCESS_SHIFT if pid else None, rows[:, 5])
        blocks.append((kind, rows, thread, start))
    rows = np.concatenate([b[1] for b in blocks])
    kinds = np.concatenate([np.full(len(b[1]), b[0], np.int8) for b in blocks])
    ids, index = np.unique(rows[:, 0], return_inverse=True)
    wanted = ",".join(str(int(i)) for i in ids[ids >= 0])
    strings = dict(db.execute(f"SELECT id, value FROM StringIds WHERE id IN ({wanted})"))
    special = {-1 - MEMCPY: "[CUDA memcpy]", -1 - MEMSET: "[CUDA memset]", -1 - GRAPH: GRAPH_NAME}
    names = [special.get(int(i)) or strings.get(int(i), f"<string {int(i)}>") for i in ids]
    col = lambda i: np.ascontiguousarray(rows[:, i])  # noqa: E731
    return KernelTable(names, index.astype(np.int32), col(1), col(2), kinds, col(3), col(4),
                       np.concatenate([b[2] for b in blocks]), np.concatenate([b[3] for b in blocks]), col(5))


def _ranges(db: sqlite3.Connection, tables: set[str]) -> list[Range]:
    if "NVTX_EVENTS" not in tables:
        return []
    cols = _columns(db, "NVTX_EVENTS")
    text = "COALESCE(n.text, s.value)" if "textId" in cols else "n.text"
    join = "LEFT JOIN StringIds s ON n.textId = s.id" if "textId" in cols else ""
    domains = dict(db.execute(
        f"SELECT domainId, text FROM NVTX_EVENTS WHERE eventType = {NVTX_DOMAIN_CREATE}"))
    rows = db.execute(
        f"SELECT {text}, n.start, n.end, n.globalTid, n.domainId FROM NVTX_EVENTS n {join} "
        f"WHERE n.eventType IN ({NVTX_PUSH_POP}, {NVTX_START_END}) AND n.end IS NOT NULL")
    # Default domain only: libraries put their own ranges in theirs (CCCL's "cub::...",
    # XLA's "TSL"), which would otherwise pass for phases.
    return sorted((Range(name, start, end, tid) for name, start, end, tid, dom in rows
                   if name and not domains.get(dom)),
                  key=lambda r: r.start)


def _api(db: sqlite3.Connection, tables: set[str]) -> list[ApiStat]:
    """Count and total time of each CUDA API function (``CUPTI_ACTIVITY_KIND_RUNTIME``)."""
    if "CUPTI_ACTIVITY_KIND_RUNTIME" not in tables:
        return []
    rows = db.execute("SELECT s.value, COUNT(*), SUM(r.end - r.start) FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
                      "JOIN StringIds s ON r.nameId = s.id GROUP BY r.nameId")
    out = []
    for name, count, total in rows:
        name = re.sub(r"_v\d+$", "", name)
        group = next((g for g, rx in API_GROUPS if rx.search(name)), "other")
        out.append(ApiStat(name, group, int(count), int(total or 0)))
    return sorted(out, key=lambda a: -a.total_ns)


def _missing_kernels(db: sqlite3.Connection, tables: set[str]) -> tuple[int, int]:
    """(kernel launch calls, those without a kernel record): lost records show as the second."""
    if not {"CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL"} <= tables:
        return 0, 0
    launches, missing = db.execute(
        "SELECT COUNT(*), SUM(NOT EXISTS (SELECT 1 FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "WHERE k.correlationId = r.correlationId)) FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
        "JOIN StringIds s ON r.nameId = s.id WHERE s.value LIKE '%LaunchKernel%' "
        "OR s.value LIKE 'cuLaunch%'").fetchone()
    return int(launches or 0), int(missing or 0)


def _open_sqlite(path: Path, tmp: Path) -> sqlite3.Connection:
    """Open the export read-only; a gzipped one is unpacked into `tmp` first."""
    if path.suffix == ".gz":
        target = tmp / "profile.sqlite"
        try:
            with gzip.open(path) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        except (OSError, EOFError) as exc:
            raise ProfileError(f"{path}: not a gzip file ({exc}); expected .sqlite.gz from "
                               "`nsys export --type sqlite` then gzip") from None
        path = target
    with open(path, "rb") as f:
        if f.read(len(_SQLITE_MAGIC)) != _SQLITE_MAGIC:
            raise ProfileError(f"{path}: not an SQLite file; pass an .nsys-rep, or its export "
                               "from `nsys export --type sqlite`")
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)


def read_sqlite(path: str | Path, label: str | None = None, force: bool = False) -> Profile:
    """Read an nsys SQLite export (``.sqlite`` or ``.sqlite.gz``) into a `Profile`.

    When nsys's importer reported errors, the profile is refused only if kernel records
    are actually missing (kernel launches without a kernel); `force` reads it anyway."""
    path = Path(path)
    with tempfile.TemporaryDirectory() as tmp:
        db = _open_sqlite(path, Path(tmp))
        try:
            tables = _tables(db)
            if not tables & {"StringIds", "TARGET_INFO_SESSION_START_TIME", "NVTX_EVENTS"}:
                raise ProfileError(f"{path}: SQLite, but not an nsys export (no nsys tables)")
            diagnostics = _diagnostics(db, tables)
            launches, missing = _missing_kernels(db, tables) if diagnostics else (0, 0)
            kernels = _kernels(db, tables) if "CUPTI_ACTIVITY_KIND_KERNEL" in tables else None
            ranges = _ranges(db, tables)
            api = _api(db, tables)
        finally:
            db.close()
    tsl = "for JAX profile with --nvtx-domain-exclude=TSL (XLA's NVTX domain breaks the importer)"
    if kernels is None or not len(kernels):
        raise ProfileError(
            f"{path}: no CUDA kernel records; profile with --trace=cuda on a GPU run; "
            "for JAX add --nvtx-domain-exclude=TSL (XLA's NVTX domain makes the importer "
            "drop every kernel)")
    notes = []
    if diagnostics:
        lost = missing > MISSING_SHARE * launches
        if lost and not force:
            raise ProfileError(
                f"{path}: nsys's importer failed ({diagnostics[0]}) and {missing} of {launches} kernel launches "
                f"have no kernel record; {tsl}, or pass --force to analyse what is there")
        notes.append(f"nsys's importer reported an error ({diagnostics[0]}); "
                     + (f"{missing} of {launches} kernel launches have no kernel record (analysed anyway, "
                        "--force)" if lost else f"all {launches} kernel launches have their kernel record, so "
                        "the analysis goes on") + f"; {tsl}")
    graphs = kernels.kind == GRAPH
    if graphs.any():
        ns = int(kernels.duration[graphs].sum())
        notes.append(GRAPH_NOTE.format(count=int(graphs.sum()), ms=ns / 1e6, name=GRAPH_NAME))
    return Profile(str(path), label or label_from_path(path), "nsys", kernels, ranges, notes, api)
