"""Nsight Systems: the `nsys profile` command, SQLite export, and reading the export.

The reader returns the profile model of `harness.trace.profile`, as the framework-profiler
fallback (`harness.trace.sources.framework_profile`) does, so both feed the same analysis
(`harness.trace.analyses.breakdown`).

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
import os
import re
import shutil
import sqlite3
import subprocess
import tempfile
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from harness.trace.analyses.attribution import TID_PROCESS_SHIFT
from harness.trace.profile import (
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
from harness.trace.sources.nsys_launches import launches_per_phase
from harness.trace.sources.registry import LoadOptions, source
from harness.trace.sources.sqlite_load import ParallelReader

# --cuda-graph-trace=node: XLA replays steps as CUDA graphs, which nsys otherwise records
# as one graph-level event each, hiding every kernel of the measured steps.
TRACE_FLAGS = ("--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none", "--cuda-graph-trace=node")
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
    output: str | Path, program: Sequence[str], nsys: str | None = None, flags: Sequence[str] = ()
) -> list[str]:
    """The `nsys profile` argv that runs `program` and writes ``<output>.nsys-rep``;
    `flags`: the backend's own (`harness.backends.Backend.nsys_flags`)."""
    return [
        find_nsys(nsys),
        "profile",
        *TRACE_FLAGS,
        *flags,
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


def _launches(reader: ParallelReader, tables: set[str]) -> Callable[[], np.ndarray]:
    """Start reading (process, correlationId, globalTid, start) of every API call that puts
    work on the GPU; the result is sorted by (process, correlationId): the launch side of the
    CUPTI correlation."""
    if "CUPTI_ACTIVITY_KIND_RUNTIME" not in tables:
        return lambda: np.empty((0, 4), np.int64)
    ids = [str(i) for i, in reader.db.execute(
        "SELECT id FROM StringIds WHERE value LIKE 'cu%Launch%' OR value LIKE 'cu%Memcpy%' "
        "OR value LIKE 'cu%Memset%' OR value LIKE 'cu%Graph%Launch%'")]
    pending = reader.columns("CUPTI_ACTIVITY_KIND_RUNTIME",
                             [f"COALESCE(globalTid, {UNKNOWN})", "correlationId", "start"],
                             f"nameId IN ({','.join(ids)}) AND correlationId IS NOT NULL")

    def result() -> np.ndarray:
        tid, correlation, start = pending()
        rows = np.stack([tid >> TID_PROCESS_SHIFT, correlation, tid, start], axis=1)
        return rows[np.lexsort((rows[:, 1], rows[:, 0]))]
    return result


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


def _kernels(reader: ParallelReader, tables: set[str]) -> Callable[[], KernelTable]:
    """Start reading kernels, memcpys, memsets and whole-graph records; the result is their
    table, names fetched once each."""
    db = reader.db
    kcols = _columns(db, "CUPTI_ACTIVITY_KIND_KERNEL")
    name_col = "demangledName" if "demangledName" in kcols else "shortName"
    launches = _launches(reader, tables)
    pending, names_sql = [], {"CUPTI_ACTIVITY_KIND_KERNEL": f"{name_col}"}
    for table, kind in (("CUPTI_ACTIVITY_KIND_KERNEL", KERNEL), ("CUPTI_ACTIVITY_KIND_MEMCPY", MEMCPY),
                        ("CUPTI_ACTIVITY_KIND_MEMSET", MEMSET), ("CUPTI_ACTIVITY_KIND_GRAPH_TRACE", GRAPH)):
        if table not in tables:
            continue
        pid = "globalPid" in _columns(db, table)
        # a negative name id marks the kind of a record without a name; string ids are >= 0
        cols = reader.columns(table, [str(names_sql.get(table, -1 - kind)), "start", "end", "deviceId", "streamId",
                                      f"COALESCE(correlationId, {UNKNOWN})", "globalPid" if pid else "0"])
        pending.append((kind, pid, cols))

    def result() -> KernelTable:
        launch = launches()
        blocks = []
        for kind, pid, cols in pending:
            name, start, end, device, stream, correlation, gpid = cols()
            process = gpid >> TID_PROCESS_SHIFT if pid else None
            thread, launched = _match(launch, process, correlation)
            if process is None:
                process = np.where(thread != UNKNOWN, thread >> TID_PROCESS_SHIFT, UNKNOWN)
            blocks.append((np.full(len(name), kind, np.int8), name, start, end, device, stream, thread, launched,
                           correlation, process))
        kinds, name, start, end, device, stream, thread, launched, correlation, process = (
            np.concatenate(col) for col in zip(*blocks))
        ids, index = np.unique(name, return_inverse=True)
        wanted = ",".join(str(int(i)) for i in ids[ids >= 0])
        strings = dict(db.execute(f"SELECT id, value FROM StringIds WHERE id IN ({wanted})"))
        special = {-1 - MEMCPY: "[CUDA memcpy]", -1 - MEMSET: "[CUDA memset]", -1 - GRAPH: GRAPH_NAME}
        names = [special.get(int(i)) or strings.get(int(i), f"<string {int(i)}>") for i in ids]
        return KernelTable(names, index.astype(np.int32), start, end, kinds, device, stream, thread, launched,
                           correlation, process)
    return result


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


def _api(reader: ParallelReader, tables: set[str]) -> Callable[[], list[ApiStat]]:
    """Start counting calls and time of each CUDA API function (``CUPTI_ACTIVITY_KIND_RUNTIME``);
    the result is sorted by total time. Each rowid range is grouped by function id on its
    thread (SQLite's sort keeps memory bounded, where the range's columns as text would not);
    names are looked up for the few ids."""
    if "CUPTI_ACTIVITY_KIND_RUNTIME" not in tables:
        return lambda: []

    parts = reader.per_range("CUPTI_ACTIVITY_KIND_RUNTIME", lambda db, rowids: db.execute(
        "SELECT nameId, COUNT(*), COALESCE(SUM(end - start), 0) FROM CUPTI_ACTIVITY_KIND_RUNTIME "
        f"WHERE {rowids} GROUP BY nameId").fetchall())

    def result() -> list[ApiStat]:
        count: dict[int, int] = defaultdict(int)
        total: dict[int, int] = defaultdict(int)
        for part in parts:
            for i, n, ns in part.result():
                count[i] += n
                total[i] += ns
        names = dict(reader.db.execute(f"SELECT id, value FROM StringIds WHERE id IN ({','.join(map(str, count))})"))
        out = []
        for i in sorted(count):
            if i in names:
                name = re.sub(r"_v\d+$", "", names[i])
                group = next((g for g, rx in API_GROUPS if rx.search(name)), "other")
                out.append(ApiStat(name, group, count[i], total[i]))
        return sorted(out, key=lambda a: -a.total_ns)
    return result


def _missing_kernels(reader: ParallelReader, tables: set[str]) -> Callable[[], tuple[int, int]]:
    """Start counting (kernel launch calls, those without a kernel record): lost records show as
    the second."""
    if not {"CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL"} <= tables:
        return lambda: (0, 0)
    pending = reader.query(
        "SELECT COUNT(*), SUM(NOT EXISTS (SELECT 1 FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "WHERE k.correlationId = r.correlationId)) FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
        "JOIN StringIds s ON r.nameId = s.id WHERE s.value LIKE '%LaunchKernel%' "
        "OR s.value LIKE 'cuLaunch%'")

    def result() -> tuple[int, int]:
        launches, missing = pending.result()[0]
        return int(launches or 0), int(missing or 0)
    return result


def _gpu_name(db: sqlite3.Connection, tables: set[str]) -> str | None:
    """The GPUs' names (``TARGET_INFO_GPU``), distinct ones joined by " + "."""
    if "TARGET_INFO_GPU" not in tables or "name" not in _columns(db, "TARGET_INFO_GPU"):
        return None
    names = sorted({n for n, in db.execute("SELECT name FROM TARGET_INFO_GPU") if n})
    return " + ".join(names) or None


def _unpack(path: Path, tmp: Path) -> Path:
    """The SQLite file of the export `path`; a gzipped one is unpacked into `tmp` first."""
    sqlite = path
    if path.suffix == ".gz":
        sqlite = tmp / "profile.sqlite"
        try:
            with gzip.open(path) as src, open(sqlite, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        except (OSError, EOFError) as exc:
            raise ProfileError(f"{path}: not a gzip file ({exc}); expected .sqlite.gz from "
                               "`nsys export --type sqlite` then gzip") from None
    with open(sqlite, "rb") as f:  # errors name `path`, the user's file, never the unpacked copy
        if f.read(len(_SQLITE_MAGIC)) != _SQLITE_MAGIC:
            what = "empty" if os.path.getsize(sqlite) == 0 else "not an SQLite file"
            raise ProfileError(f"{path}: {what}{' once unpacked' if sqlite != path else ''}; pass an .nsys-rep, "
                               "or its export from `nsys export --type sqlite`")
    return sqlite


def read_sqlite(path: str | Path, label: str | None = None, force: bool = False) -> Profile:
    """Read an nsys SQLite export (``.sqlite`` or ``.sqlite.gz``) into a `Profile`; a
    damaged file (truncated in a copy, say) is a ProfileError naming it."""
    try:
        return _read_sqlite(Path(path), label, force)
    except sqlite3.DatabaseError as exc:
        raise ProfileError(f"{path}: the SQLite file is damaged ({exc}), truncated perhaps; export it again with "
                           "`nsys export --type sqlite`") from None


def _read_sqlite(path: Path, label: str | None, force: bool) -> Profile:
    """Read an nsys SQLite export (``.sqlite`` or ``.sqlite.gz``) into a `Profile`.

    The large tables are read on a pool of threads (`harness.trace.sources.sqlite_load`) while this
    thread reads the small ones. When nsys's importer reported errors, the profile is refused
    only if kernel records are actually missing (kernel launches without a kernel); `force`
    reads it anyway."""
    with tempfile.TemporaryDirectory() as tmp, ParallelReader(_unpack(path, Path(tmp))) as reader:
        tables = _tables(reader.db)
        if not tables & {"StringIds", "TARGET_INFO_SESSION_START_TIME", "NVTX_EVENTS"}:
            raise ProfileError(f"{path}: SQLite, but not an nsys export (no nsys tables)")
        diagnostics = _diagnostics(reader.db, tables)
        # the longest reads first: the pool takes them in order
        pending_missing = _missing_kernels(reader, tables) if diagnostics else lambda: (0, 0)
        pending_api = _api(reader, tables)
        pending_kernels = _kernels(reader, tables) if "CUPTI_ACTIVITY_KIND_KERNEL" in tables else lambda: None
        ranges = _ranges(reader.db, tables)
        gpu = _gpu_name(reader.db, tables)
        start = (reader.db.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
                 if "TARGET_INFO_SESSION_START_TIME" in tables else None)
        launches, missing = pending_missing()
        kernels, api = pending_kernels(), pending_api()
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
    return Profile(str(path), label or label_from_path(path), "nsys", kernels, ranges, notes, api, gpu=gpu,
                   session_start_ns=int(start[0]) if start and start[0] is not None else None)


@source("nsys-rep", claims=lambda p: p.name.endswith(".nsys-rep"), describe=".nsys-rep",
        launches=lambda p, o: launches_per_phase(p))
def _load_report(path: Path, options: LoadOptions) -> Profile:
    """An Nsight Systems report, exported to ``X.sqlite`` beside it first (`export_sqlite`)."""
    return read_sqlite(export_sqlite(path, options.nsys_bin), options.label, options.force)


@source("nsys-sqlite", claims=lambda p: p.name.endswith((".sqlite", ".sqlite.gz")),
        describe=".sqlite[.gz] (nsys export)", launches=lambda p, o: launches_per_phase(p))
def _load_export(path: Path, options: LoadOptions) -> Profile:
    """An nsys SQLite export (`read_sqlite`)."""
    return read_sqlite(path, options.label, options.force)
