"""Time `harness.report` on rank sets of growing size built from real per-rank traces.

    python -m harness.bench_ranks RANK_FILE... --ranks 8,64,512 --out results/report-speed/at-scale/fsdp2.json

For each size N, `harness.trace.rank_copies.copy_ranks` writes N ranks (copies of the given
files, renumbered, stretched with seed 0, rank 5 planted 30% slow) into a temporary
folder, untimed; then ``python -m harness.report FOLDER --no-plot`` runs once in a fresh
process, as a user runs it. Measured: wall seconds; peak memory, three ways: the report
process's own peak RSS and its largest worker's (``getrusage``, self and children), and
the peak of their sum sampled every 0.1 s from /proc (all processes of the run at once);
and the report's length (lines of kernels.md, bytes of kernels.md, report.html and
ranks.csv, rows of ranks.csv). The machine's cores and load average (before and after)
go into the document: a shared machine's times are only as good as its load. Writes
the JSON document at --out and the same as a markdown table beside it (.md).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from harness import child_process, stopped_by
from harness.cli.dialect import comma_list, fail, make_parser, parse_args, positive_int
from harness.common.results import git_commit
from harness.trace.analyses.ranks import workers
from harness.trace.rank_copies import copy_ranks

# Runs harness.report in this process and prints its own and its largest child's peak RSS (KiB).
_WRAPPER = """
import json, resource, runpy, sys
sys.argv = ["harness.report", *sys.argv[1:]]
try:
    runpy.run_module("harness.report", run_name="__main__")
except SystemExit as exc:
    code = exc.code or 0
else:
    code = 0
print(json.dumps({"self_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "children_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}), file=sys.stderr)
sys.exit(code)
"""


def build_parser():
    p = make_parser("harness.bench_ranks", __doc__)
    p.add_argument("files", nargs="+", help="one job's per-rank torch.profiler traces (.json or .json.gz)")
    p.add_argument("--ranks", type=comma_list(positive_int), default=[8, 64, 512], help="set sizes, comma-separated")
    p.add_argument("--out", required=True, metavar="PATH", help="the JSON document to write (and PATH.md beside it)")
    return p


def _tree_rss_kib(pid: int) -> int:
    """Resident KiB of `pid` and its descendants, from /proc (0 where it has gone)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            total += next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, StopIteration, ValueError):
            continue
    return total


def run_report(folder: Path, out: Path) -> dict:
    """One timed run of the report on `folder` (module docstring)."""
    peak = [0]
    with child_process([sys.executable, "-c", _WRAPPER, str(folder), "--out", str(out), "--no-plot"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as proc:
        start = time.perf_counter()

        def sample() -> None:
            while proc.poll() is None:
                peak[0] = max(peak[0], _tree_rss_kib(proc.pid))
                time.sleep(0.1)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, err = proc.communicate()
        wall = time.perf_counter() - start
        sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"harness.report failed on {folder}: {(err.strip().splitlines() or ['no output'])[-1]}")
    rusage = json.loads(err.strip().splitlines()[-1])
    md = (out / "kernels.md").read_text()
    csv_rows = (out / "ranks.csv").read_text().count("\n") - 1
    return {"wall_s": round(wall, 2), "peak_rss_mib": {"report": round(rusage["self_kib"] / 1024, 1),
                                                       "largest_worker": round(rusage["children_kib"] / 1024, 1),
                                                       "all_processes_sampled": round(peak[0] / 1024, 1)},
            "kernels_md_lines": md.count("\n"), "kernels_md_bytes": len(md.encode()),
            "report_html_bytes": (out / "report.html").stat().st_size,
            "ranks_csv_rows": csv_rows, "ranks_csv_bytes": (out / "ranks.csv").stat().st_size}


def bench(files: Sequence[Path], sizes: Sequence[int]) -> dict:
    """The benchmark's document: the machine, and one entry per set size. Stopped (Ctrl-C, a
    stop signal), it holds the sizes that finished and `interrupted` says where it stopped."""
    sources = [{"name": f.name, "bytes": f.stat().st_size, "uncompressed_bytes": _raw_size(f)} for f in files]
    doc = {"command": " ".join(["python -m harness.bench_ranks", *map(str, files),
                                "--ranks", ",".join(map(str, sizes))]),
           "commit": git_commit(), "python": platform.python_version(), "machine": platform.machine(),
           "cores": os.cpu_count(), "workers": workers(), "sources": sources, "runs": []}
    for n in sizes:
        try:
            with tempfile.TemporaryDirectory() as tmp:
                ranks = Path(tmp) / "ranks"
                copy_ranks(files, n, ranks, seed=0, stragglers=(5,))
                load_before = os.getloadavg()
                run = run_report(ranks, Path(tmp) / "report")
        except KeyboardInterrupt as exc:
            done = ", ".join(str(r["ranks"]) for r in doc["runs"]) or "none"
            doc["interrupted"] = f"stopped by {stopped_by(exc)} while timing {n} ranks; finished: {done}"
            return doc
        doc["runs"].append({"ranks": n, **run, "load_average_before": [round(x, 2) for x in load_before],
                            "load_average_after": [round(x, 2) for x in os.getloadavg()]})
    return doc


def _raw_size(path: Path) -> int:
    import gzip

    return len(gzip.decompress(path.read_bytes())) if path.name.endswith(".gz") else path.stat().st_size


def answer(doc: dict) -> str:
    """How the report held up from the fewest ranks to the most: wall time, the report process's
    peak memory and the length of kernels.md."""
    runs = sorted(doc["runs"], key=lambda r: r["ranks"])
    if not runs:
        return "No set size finished."
    lo, hi = runs[0], runs[-1]
    if lo is hi:
        return (f"At {hi['ranks']} ranks `harness.report` took {hi['wall_s']:.1f} s on {doc['cores']} cores, its "
                f"process peaked at {hi['peak_rss_mib']['report']:.0f} MiB, and kernels.md has "
                f"{hi['kernels_md_lines']} lines.")
    return (f"From {lo['ranks']} to {hi['ranks']} ranks `harness.report` took {lo['wall_s']:.1f} -> "
            f"{hi['wall_s']:.1f} s on {doc['cores']} cores, its process peaked at "
            f"{lo['peak_rss_mib']['report']:.0f} -> {hi['peak_rss_mib']['report']:.0f} MiB, and kernels.md has "
            f"{lo['kernels_md_lines']} -> {hi['kernels_md_lines']} lines.")


def markdown(doc: dict) -> str:
    """The answer, then the document's runs as a markdown table, with the machine and the sources."""
    src = ", ".join(f"`{s['name']}` ({s['uncompressed_bytes'] / 1e6:.1f} MB)" for s in doc["sources"])
    lines = [answer(doc), "",
             f"Sources: {src}; {doc['cores']} cores, {doc['workers']} worker processes; commit "
             f"{(doc['commit'] or 'unknown')[:12]}.", *([f"Interrupted: {doc['interrupted']}."]
                                                          if doc.get("interrupted") else []), "",
             "| ranks | wall s | peak RSS MiB: report | largest worker | all processes (sampled) | kernels.md lines "
             "| kernels.md KB | report.html KB | ranks.csv rows | load average before / after (1 min) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["runs"]:
        m = r["peak_rss_mib"]
        lines.append(f"| {r['ranks']} | {r['wall_s']:.1f} | {m['report']:.0f} | {m['largest_worker']:.0f} | "
                     f"{m['all_processes_sampled']:.0f} | {r['kernels_md_lines']} | "
                     f"{r['kernels_md_bytes'] / 1e3:.0f} | "
                     f"{r['report_html_bytes'] / 1e3:.0f} | {r['ranks_csv_rows']} | "
                     f"{r['load_average_before'][0]:.1f} / {r['load_average_after'][0]:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    files = [Path(f) for f in args.files]
    if missing := [f for f in files if not f.is_file()]:
        return fail(f"{missing[0]}: no such file; pass one job's per-rank torch.profiler traces")
    try:
        doc = bench(files, args.ranks)
    except RuntimeError as exc:
        return fail(str(exc))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(doc))
    print(markdown(doc), end="")
    if stopped := doc.get("interrupted"):
        return fail(f"interrupted: {stopped}; the finished sizes are kept in {out}", 130)
    return 0


if __name__ == "__main__":
    sys.exit(main())
