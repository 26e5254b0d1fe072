"""Time `harness.report` against `nsys stats`' kernel summary on the same profile.

    python -m harness.bench_report PROFILE [--nsys-bin BIN] [--repeat N]

Both run as a user runs them, each in a fresh process: `nsys stats --report
cuda_gpu_kern_sum --format csv`, `python -m harness.report PROFILE` (its default outputs:
kernels.md/.csv/.json, kernels.png and report.html) and the same with `--no-plot`, writing
into a temporary folder. An ``.nsys-rep`` is exported to SQLite first, so both read the
same file. One untimed run of each comes first (both then find the file in the page
cache, and Python the bytecode it compiled); the timed runs are interleaved, so drifts of
the machine hit both alike. Prints the median wall time of each over `--repeat` runs, the
peak RSS of each (each child's own ``ru_maxrss``), and the ratios harness/nsys.

Python compiles a module once and caches its bytecode, as an installed package has it.
Where this machine keeps it from doing so (``PYTHONDONTWRITEBYTECODE``, or folders it
cannot write) the report runs with its bytecode cached in a temporary folder
(``PYTHONPYCACHEPREFIX``), which leaves the installation untouched; the report is then
timed once more as this machine runs it, compiling every module on every run, and both
figures are printed. Without nsys it says so in one line and times the harness alone.
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

from harness import child_process, stopped_by
from harness.cli.dialect import add_nsys_bin, fail, make_parser, parse_args, positive_int
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


def _timed(cmd: Sequence[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """(wall seconds, peak RSS in MiB) of one subprocess (its own rusage, from wait4: the
    report's drawing process, forked from it, is not counted)."""
    with tempfile.TemporaryFile() as log:
        start = time.perf_counter()
        with child_process(cmd, stdout=subprocess.DEVNULL, stderr=log, env=env) as proc:
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not signal its pid
        wall = time.perf_counter() - start
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


def bench(profile: Path, repeat: int, nsys_bin: str | None, as_configured: bool = False) -> dict[str, dict[str, float]]:
    """Median wall time and peak RSS of the nsys baseline (if nsys is found) and the harness,
    the harness with its bytecode cached; with `as_configured`, also the default report as
    this machine's settings run it (``harness_as_configured``)."""
    try:
        nsys = find_nsys(nsys_bin)
    except ProfileError:
        nsys = None
    if profile.name.endswith(".nsys-rep"):
        if nsys is None:
            raise ProfileError(f"{profile}: an .nsys-rep needs nsys to export it; pass its .sqlite export")
        profile = export_sqlite(profile, nsys)
    with tempfile.TemporaryDirectory() as out:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = os.path.join(out, "pycache")
        report = [sys.executable, "-m", "harness.report", str(profile), "--out", os.path.join(out, "report")]
        cmds = {"harness": ([*report, "--no-plot"], env), "harness_png": (report, env)}
        if as_configured:
            cmds["harness_as_configured"] = (report, None)
        if nsys:
            cmds["nsys"] = ([nsys, "stats", "--report", "cuda_gpu_kern_sum", "--format", "csv", "--force-export",
                             "false", str(profile)], None)
        runs: dict[str, list[tuple[float, float]]] = {k: [] for k in cmds}
        stopped = None
        try:
            for i in range(repeat + 1):  # the first round untimed
                for name, (cmd, cmd_env) in cmds.items():
                    timed = _timed(cmd, cmd_env)
                    if i:
                        runs[name].append(timed)
        except KeyboardInterrupt as exc:  # the rounds that finished are kept; none finished, nothing is
            rounds = min(len(rs) for rs in runs.values())
            if not rounds:
                raise
            runs = {k: rs[:rounds] for k, rs in runs.items()}
            stopped = f"stopped by {stopped_by(exc)} after {rounds} of {repeat} timed rounds"
    peak = lambda rs: max(r[1] for r in rs)  # noqa: E731
    result = {k: {"median_s": statistics.median(r[0] for r in rs), "peak_rss_mib": peak(rs)} for k, rs in runs.items()}
    if nsys is None:
        result["nsys"] = {}
    result["rounds"], result["interrupted"] = len(runs["harness"]), stopped
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    profile = Path(args.profile)
    if not profile.is_file():
        return fail(f"{profile}: no such file; pass an .nsys-rep or its .sqlite export")
    uncached, modules = uncached_modules()
    try:
        result = bench(profile, args.repeat, args.nsys_bin, as_configured=uncached > 0)
    except ProfileError as exc:
        return fail(str(exc))
    except KeyboardInterrupt as exc:
        return fail(f"interrupted by {stopped_by(exc)} before a timed round finished; nothing to report", 130)
    code = print_result(result, uncached, modules)
    if result["interrupted"]:
        return fail(f"interrupted: {result['interrupted']}; the medians above are over those rounds", 130)
    return code


def print_result(result: dict, uncached: int, modules: int) -> int:
    """The benchmark's lines, each median over the timed rounds that ran."""
    repeat = result["rounds"]
    h, hp, n = result["harness"], result["harness_png"], result["nsys"]
    ratio = (lambda r: f" ({r['median_s'] / n['median_s']:.2f}x nsys stats)") if n else (lambda r: "")
    print(f"harness.report (default outputs: tables, kernels.png, report.html): median {hp['median_s']:.3f} s over "
          f"{repeat} runs{ratio(hp)}, peak RSS {hp['peak_rss_mib']:.0f} MiB (includes the interpreter and "
          "imports)")
    print(f"harness.report --no-plot: median {h['median_s']:.3f} s{ratio(h)}, peak RSS {h['peak_rss_mib']:.0f} MiB")
    if uncached:
        unset = sys.flags.dont_write_bytecode or os.environ.get("PYTHONDONTWRITEBYTECODE")
        why = "PYTHONDONTWRITEBYTECODE is set" if unset else "their folders are not writable"
        a = result["harness_as_configured"]
        print(f"harness.report as this machine runs it, compiling {uncached} of the {modules} Python modules it "
              f"imports on every run ({why}; the figures above have them cached, as an installed package "
              f"has): median {a['median_s']:.3f} s{ratio(a)}")
    if not n:
        print("nsys not found: no baseline timed (install Nsight Systems, or pass --nsys-bin)")
        return 0
    print(f"nsys stats cuda_gpu_kern_sum: median {n['median_s']:.3f} s over {repeat} runs, peak RSS "
          f"{n['peak_rss_mib']:.0f} MiB")
    print(f"ratio harness/nsys: {hp['median_s'] / n['median_s']:.2f}x (without the plot: "
          f"{h['median_s'] / n['median_s']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
