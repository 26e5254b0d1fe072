"""Nsight Systems: the `nsys profile` command, SQLite export, and reading the export.

The reader returns the profile model of `harness.trace.profile`, as the framework-profiler
fallback (`harness.trace.framework_profile`) does, so both feed the same analysis
(`harness.trace.breakdown`).

Reading uses these tables of the SQLite export (missing optional tables are skipped):
``CUPTI_ACTIVITY_KIND_KERNEL`` (required), ``CUPTI_ACTIVITY_KIND_MEMCPY``/``MEMSET``,
``CUPTI_ACTIVITY_KIND_RUNTIME`` (which thread launched each kernel, by correlationId),
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
from collections.abc import Sequence
from pathlib import Path

from harness.trace.profile import BACKENDS, Kernel, Profile, ProfileError, Range, label_from_path

# --cuda-graph-trace=node: XLA replays steps as CUDA graphs, which nsys otherwise records
# as one graph-level event each, hiding every kernel of the measured steps.
TRACE_FLAGS = ("--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none", "--cuda-graph-trace=node")
# XLA's own NVTX ranges (domain "TSL") break the nsys importer ("Cannot find string for
# an exterior index"), which then drops every kernel record; the harness's ranges live
# in the default domain, so excluding TSL keeps kernels and phase ranges.
JAX_FLAGS = ("--nvtx-domain-exclude=TSL",)
GRAPH_NOTE = ("CUDA graphs were traced as whole graphs ([CUDA graph] entries): their kernels are "
              "hidden; profile with --cuda-graph-trace=node")
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


def _kernels(db: sqlite3.Connection, tables: set[str]) -> list[Kernel]:
    kcols = _columns(db, "CUPTI_ACTIVITY_KIND_KERNEL")
    name_col = "demangledName" if "demangledName" in kcols else "shortName"
    launch = ""
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
        # correlationIds are unique per process only: match the process as well
        same_pid = ("AND r.globalTid / 16777216 = k.globalPid / 16777216"
                    if "globalPid" in kcols else "")
        launch = f"LEFT JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId {same_pid}"
    thread = "r.globalTid" if launch else "NULL"
    sql = (f"SELECT s.value, k.start, k.end, k.deviceId, k.streamId, {thread} "
           f"FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON k.{name_col} = s.id {launch}")
    kernels = [Kernel(*row) for row in db.execute(sql)]
    for table, what in (("CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy"), ("CUPTI_ACTIVITY_KIND_MEMSET", "memset"),
                        ("CUPTI_ACTIVITY_KIND_GRAPH_TRACE", "graph (whole, kernels not traced)")):
        if table in tables:
            kernels += [Kernel(f"[CUDA {what}]", *row) for row in
                        db.execute(f"SELECT start, end, deviceId, streamId FROM {table}")]
    return sorted(kernels, key=lambda k: k.start)


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


def _open_sqlite(path: Path, tmp: Path) -> sqlite3.Connection:
    raw = path.read_bytes()
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise ProfileError(f"{path}: not a gzip file ({exc}); expected .sqlite.gz from "
                               "`nsys export --type sqlite` then gzip") from None
    if not raw.startswith(_SQLITE_MAGIC):
        raise ProfileError(f"{path}: not an SQLite file; pass an .nsys-rep, or its export "
                           "from `nsys export --type sqlite`")
    (tmp / "profile.sqlite").write_bytes(raw)
    return sqlite3.connect(tmp / "profile.sqlite")


def read_sqlite(path: str | Path, label: str | None = None) -> Profile:
    """Read an nsys SQLite export (``.sqlite`` or ``.sqlite.gz``) into a `Profile`."""
    path = Path(path)
    with tempfile.TemporaryDirectory() as tmp:
        db = _open_sqlite(path, Path(tmp))
        try:
            tables = _tables(db)
            if not tables & {"StringIds", "TARGET_INFO_SESSION_START_TIME", "NVTX_EVENTS"}:
                raise ProfileError(f"{path}: SQLite, but not an nsys export (no nsys tables)")
            diagnostics = _diagnostics(db, tables)
            kernels = _kernels(db, tables) if "CUPTI_ACTIVITY_KIND_KERNEL" in tables else []
            ranges = _ranges(db, tables)
        finally:
            db.close()
    if diagnostics:
        raise ProfileError(
            f"{path}: nsys's importer failed ({diagnostics[0]}), so records may be missing; "
            "for JAX profile with --nvtx-domain-exclude=TSL (XLA's NVTX domain breaks the importer)")
    if not kernels:
        raise ProfileError(
            f"{path}: no CUDA kernel records; profile with --trace=cuda on a GPU run; "
            "for JAX add --nvtx-domain-exclude=TSL (XLA's NVTX domain makes the importer "
            "drop every kernel)")
    notes = [GRAPH_NOTE] if any(k.name.startswith("[CUDA graph") for k in kernels) else []
    return Profile(str(path), label or label_from_path(path), "nsys", kernels, ranges, notes)
