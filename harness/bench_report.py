"""Time `harness.report` against `nsys stats`' kernel summary on the same profile.

    python -m harness.bench_report PROFILE [--nsys-bin BIN] [--repeat N]

Both run as a user runs them, each in a fresh process: `nsys stats --report
cuda_gpu_kern_sum --format csv` and `python -m harness.report PROFILE --no-plot` (and once
more with kernels.png), writing into a temporary folder. An ``.nsys-rep`` is exported to
SQLite first, so both read the same file. One untimed run of each comes first (both then
find the file in the page cache); the timed runs are interleaved, so drifts of the machine
hit both alike. Prints the median wall time of each over `--repeat` runs, the peak RSS of
each (each child's own ``ru_maxrss``), and the ratio harness/nsys. Where Python cannot
cache the bytecode of the modules the report imports (``PYTHONDONTWRITEBYTECODE``, or
folders it cannot write), every run compiles them; the benchmark measures that as it is
and says so. Without nsys it says so in one line and times the harness alone.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from harness.common.cli import add_nsys_bin, fail, make_parser, parse_args, positive_int
from harness.trace.profile import ProfileError
from harness.trace.sources.nsys import export_sqlite, find_nsys

# The modules `harness.report` imports that Python compiles from source in every run:
# loaded from a .py whose cached bytecode file is still missing after the import.
_UNCACHED = """
import os, sys
import harness.report
mods = [m.__spec__ for m in list(sys.modules.values()) if getattr(m, "__spec__", None) is not None
        and m.__spec__.cached and (m.__spec__.origin or "").endswith(".py")]
print(sum(not os.path.exists(s.cached) for s in mods), len(mods))
"""


def build_parser():
    p = make_parser("harness.bench_report", __doc__)
    p.add_argument("profile", help=".nsys-rep or its .sqlite export")
    p.add_argument("--repeat", type=positive_int, default=5, help="runs of each; medians are printed")
    add_nsys_bin(p)
    return p


def _timed(cmd: Sequence[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS in MiB) of one subprocess (its own rusage, from wait4)."""
    with tempfile.TemporaryFile() as log:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            log.seek(0)
            tail = log.read().decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise ProfileError(f"`{' '.join(cmd[:3])} ...` failed: {tail[0]}")
    return wall, usage.ru_maxrss / 1024


def uncached_modules() -> tuple[int, int]:
    """(modules `harness.report` imports that are compiled from source in every run, all it
    imports from source files), measured in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", _UNCACHED], capture_output=True, text=True, check=True).stdout
    uncached, total = out.split()
    return int(uncached), int(total)


def bench(profile: Path, repeat: int, nsys_bin: str | None) -> dict[str, dict[str, float]]:
    """Median wall time and peak RSS of the nsys baseline (if nsys is found) and the harness."""
    try:
        nsys = find_nsys(nsys_bin)
    except ProfileError:
        nsys = None
    if profile.name.endswith(".nsys-rep"):
        if nsys is None:
            raise ProfileError(f"{profile}: an .nsys-rep needs nsys to export it; pass its .sqlite export")
        profile = export_sqlite(profile, nsys)
    with tempfile.TemporaryDirectory() as out:
        report = [sys.executable, "-m", "harness.report", str(profile), "--out", out]
        cmds = {"harness": [*report, "--no-plot"], "harness_png": report}
        if nsys:
            cmds["nsys"] = [nsys, "stats", "--report", "cuda_gpu_kern_sum", "--format", "csv", "--force-export",
                            "false", str(profile)]
        runs: dict[str, list[tuple[float, float]]] = {k: [] for k in cmds}
        for i in range(repeat + 1):  # the first round untimed
            for name, cmd in cmds.items():
                timed = _timed(cmd)
                if i:
                    runs[name].append(timed)
    peak = lambda rs: max(r[1] for r in rs)  # noqa: E731
    result = {k: {"median_s": statistics.median(r[0] for r in rs), "peak_rss_mib": peak(rs)} for k, rs in runs.items()}
    if nsys is None:
        result["nsys"] = {}
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    profile = Path(args.profile)
    if not profile.is_file():
        return fail(f"{profile}: no such file; pass an .nsys-rep or its .sqlite export")
    try:
        result = bench(profile, args.repeat, args.nsys_bin)
    except ProfileError as exc:
        return fail(str(exc))
    h, hp = result["harness"], result["harness_png"]
    uncached, modules = uncached_modules()
    if uncached:
        why = "PYTHONDONTWRITEBYTECODE is set" if sys.flags.dont_write_bytecode else "their folders are not writable"
        print(f"note: {uncached} of the {modules} Python modules harness.report imports have no cached bytecode and "
              f"cannot get one here ({why}): every run compiles them, and the times below include that, as every "
              "run of a user's would here")
    print(f"harness.report --no-plot (analysis, md/csv/json): median {h['median_s']:.3f} s over {args.repeat} "
          f"runs, peak RSS {h['peak_rss_mib']:.0f} MiB (includes the interpreter and imports)")
    print(f"harness.report (with kernels.png): median {hp['median_s']:.3f} s, peak RSS {hp['peak_rss_mib']:.0f} MiB")
    if not (n := result["nsys"]):
        print("nsys not found: no baseline timed (install Nsight Systems, or pass --nsys-bin)")
        return 0
    print(f"nsys stats cuda_gpu_kern_sum: median {n['median_s']:.3f} s over {args.repeat} runs, peak RSS "
          f"{n['peak_rss_mib']:.0f} MiB")
    print(f"ratio harness/nsys: {h['median_s'] / n['median_s']:.2f}x (with the plot: "
          f"{hp['median_s'] / n['median_s']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
