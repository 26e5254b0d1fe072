"""Capture the test fixtures on a CUDA machine from `harness.run`.

    NSYS=/path/to/nsys python tests/data/capture_fixtures.py OUT_DIR [cuda|cpu]

nsys scenarios run `python -m harness.run` under `harness.trace.sources.nsys.profile_command` and keep
the gzipped SQLite export plus the harness's result JSON.  `*_attn` wraps the naive
attention's three methods in `attn_scores`/`attn_softmax`/`attn_values` ranges (with a
device sync at each end) before calling `harness.run.main`, as --annotate-attention would.
`jax_tsl_included` leaves out --nvtx-domain-exclude=TSL on purpose: its export is the
real failure (kernel records dropped).  `*_fallback` runs `harness.timing.runner.run` inside
`harness.backends.profilers` instead of nsys.  Everything lands in
OUT_DIR/fixtures.tar, rewritten after each scenario so a timeout keeps what finished.
"""

from __future__ import annotations

import gzip
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from harness.backends import profilers
from harness.trace.sources import nsys

WORK = Path("/tmp/fixtures")
STEPS = ["--warmup", "2", "--steps", "3", "--quiet"]
NSYS_SCENARIOS: dict[str, tuple[str, list[str]]] = {
    "torch_tiny_attn": ("torch", ["--model", "tiny", "--ctx", "64", "--mode", "train"]),
    "jax_tiny_train": ("jax", ["--model", "tiny", "--ctx", "64", "--mode", "train"]),
    "jax_tsl_included": ("jax", ["--model", "tiny", "--ctx", "64", "--mode", "forward"]),
    "torch_small_train": ("torch", ["--model", "small", "--ctx", "128", "--mode", "train"]),
    "jax_small_train": ("jax", ["--model", "small", "--ctx", "128", "--mode", "train"]),
}
ATTENTION = {"scores": "attn_scores", "softmax": "attn_softmax", "values": "attn_values"}


def gz(src: Path, dst: Path) -> None:
    with open(src, "rb") as f, gzip.open(dst, "wb", 9) as g:
        shutil.copyfileobj(f, g)


# Tables the reader does not use, dropped to keep the fixtures small.
UNUSED_TABLES = ("PROFILER_OVERHEAD", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "CUPTI_ACTIVITY_KIND_CUDA_EVENT",
                 "CUDA_GRAPH_EVENTS", "PROCESSES", "META_DATA_CAPTURE",
                 "TARGET_INFO_SYSTEM_ENV", "ProcessStreams", "TARGET_INFO_PROCESS_ENV")  # the machine's environment


def slim(sqlite: Path) -> None:
    """Drop unused tables and the runtime calls that launched no kernel, then VACUUM."""
    import sqlite3

    with sqlite3.connect(sqlite) as db:
        for table in UNUSED_TABLES:
            db.execute(f"DROP TABLE IF EXISTS {table}")
        db.execute("DELETE FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId NOT IN "
                   "(SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL)")
        scrub_paths(db, str(Path.cwd()))
        scrub_environment(db)
    with sqlite3.connect(sqlite) as db:
        db.execute("VACUUM")


def scrub_environment(db) -> None:
    """Empty the environment blocks nsys keeps as strings (NUL-separated NAME=value lists,
    left behind by the dropped environment tables) and cut the export's own paths to their
    file names: a fixture records what ran, not the machine it ran on."""
    db.execute("UPDATE StringIds SET value = '' WHERE instr(CAST(value AS BLOB), X'00') > 0 "
               "AND value GLOB '[A-Za-z_]*=*'")
    tables = {t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "META_DATA_EXPORT" in tables:
        for name, value in db.execute("SELECT name, value FROM META_DATA_EXPORT WHERE name LIKE '%PATH%'").fetchall():
            db.execute("UPDATE META_DATA_EXPORT SET value = ? WHERE name = ?", (Path(value).name, name))


def scrub_paths(db, root: str) -> None:
    """Rewrite the capturing checkout's absolute path out of every text value (the process
    environment and Python stacks nsys records carry it), so a fixture names no machine;
    values may hold NULs, so they are read as bytes."""
    tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()]
    for table in tables:
        for col in [r[1] for r in db.execute(f"PRAGMA table_info('{table}')")]:
            rows = db.execute(f"SELECT rowid, CAST(\"{col}\" AS BLOB) FROM '{table}' WHERE typeof(\"{col}\") = 'text' "
                              f"AND instr(CAST(\"{col}\" AS BLOB), CAST(? AS BLOB)) > 0", (root,)).fetchall()
            for rowid, raw in rows:
                text = bytes(raw).decode("utf-8").replace(root + "/", "").replace(root, ".")
                db.execute(f"UPDATE '{table}' SET \"{col}\" = ? WHERE rowid = ?", (text, rowid))


def run_annotated(argv: list[str]) -> int:
    """harness.run.main with the torch model's attention methods in NVTX ranges."""
    import torch

    from harness import run
    from harness.backends.ranges import phase_range
    from torch_impl.model import CausalSelfAttention

    for method, range_name in ATTENTION.items():
        def wrapped(self, *args, _fn=getattr(CausalSelfAttention, method), _name=range_name):  # noqa: B008
            with phase_range(_name):
                out = _fn(self, *args)
                torch.cuda.synchronize()
            return out
        setattr(CausalSelfAttention, method, wrapped)
    return run.main(argv)


def capture_nsys(name: str, backend: str, args: list[str], device: str) -> Path:
    work = WORK / name
    work.mkdir(parents=True, exist_ok=True)
    harness = ["-m", "harness.run"] if not name.endswith("_attn") else [__file__, "annotated"]
    program = [sys.executable, *harness, "--backend", backend, *args, *STEPS, "--device", device,
               "--out", str(work / f"{name}.harness.json")]
    from harness import backends

    flags = backends.get(backend).nsys_flags if name != "jax_tsl_included" else ()
    cmd = nsys.profile_command(work / "profile", program, flags=flags)
    done = subprocess.run(cmd, capture_output=True, text=True)
    (work / f"{name}.log").write_text(" ".join(cmd) + "\n" + done.stdout + done.stderr)
    sqlite = nsys.export_sqlite(work / "profile.nsys-rep")
    slim(sqlite)
    gz(sqlite, work / f"{name}.sqlite.gz")
    return work


def capture_fallback(backend: str, device: str) -> Path:
    from harness import backends
    from harness.backends import ranges
    from harness.common.results import write_json
    from harness.timing import runner

    work = WORK / f"{backend}_fallback"
    work.mkdir(parents=True, exist_ok=True)
    opts = runner.RunSpec(backend=backend, model="tiny", ctx=64, warmup=2, steps=3, device=device)
    ranges.use_framework_annotations(backends.get(backend).annotation())
    if backend == "torch":
        with profilers.torch_profiler(work / "trace.json"):
            doc = runner.run(opts)
        gz(work / "trace.json", work / "torch_tiny_fallback.json.gz")
    else:
        with profilers.jax_profiler(work / "trace"):
            doc = runner.run(opts)
        gz(next((work / "trace").rglob("*.xplane.pb")), work / "jax_tiny_fallback.xplane.pb.gz")
    ranges.use_framework_annotations(None)
    write_json(str(work / f"{backend}_tiny_fallback.harness.json"), doc)
    return work


def pack(out: Path) -> None:
    tmp = out / "fixtures.tar.tmp"
    with tarfile.open(tmp, "w") as tar:
        for f in sorted(WORK.rglob("*")):
            if f.suffix in (".gz", ".json", ".log") and f.name != "trace.json":
                tar.add(f, arcname=f"{f.parent.name}/{f.name}")
    tmp.replace(out / "fixtures.tar")


def main(out_dir: str, device: str = "cuda") -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, (backend, args) in NSYS_SCENARIOS.items():
        try:
            capture_nsys(name, backend, args, device)
        except nsys.ProfileError as exc:
            print(f"{name}: {exc}", file=sys.stderr)
        pack(out)
    for backend in ("torch", "jax"):
        subprocess.run([sys.executable, __file__, "fallback", backend, device], check=False)
        pack(out)


if __name__ == "__main__":
    if sys.argv[1] == "slim":  # for exports captured before slim() existed
        for f in sys.argv[2:]:
            slim(Path(f))
        sys.exit(0)
    if sys.argv[1] == "annotated":
        sys.exit(run_annotated(sys.argv[2:]))
    if sys.argv[1] == "fallback":
        capture_fallback(sys.argv[2], sys.argv[3])
    else:
        main(*sys.argv[1:])
