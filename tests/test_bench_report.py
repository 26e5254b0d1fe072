"""harness.bench_report: both tools timed the same way, and the bytecode caveat said where it applies."""

import stat
from pathlib import Path

from harness import bench_report

FIXTURE = Path(__file__).parent / "data" / "torch_tiny_attn" / "torch_tiny_attn.sqlite.gz"


def test_uncached_modules_follow_the_bytecode_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path / "pycache"))  # an empty cache
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    uncached, total = bench_report.uncached_modules()
    assert total > 20 and uncached >= 10  # at least the harness's own modules compile every run
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE")
    assert bench_report.uncached_modules() == (0, total)  # written by the import itself


def _fake_nsys(tmp_path: Path) -> Path:
    nsys = tmp_path / "nsys"  # stands in for nsys stats: prints a CSV header
    nsys.write_text("#!/bin/sh\necho 'Time (%),Total Time (ns)'\n")
    nsys.chmod(nsys.stat().st_mode | stat.S_IEXEC)
    return nsys


def test_bench_times_both_ways_and_keeps_the_profile(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path / "pycache"))  # empty, and never written
    assert bench_report.main([str(FIXTURE), "--repeat", "1", "--nsys-bin", str(_fake_nsys(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "harness.report (default outputs" in out and "nsys stats cuda_gpu_kern_sum: median" in out
    line = next(line for line in out.splitlines() if "as this machine runs it" in line)
    assert "x nsys stats)" in line and "PYTHONDONTWRITEBYTECODE is set" in line
    ratio = float(out.split("ratio harness/nsys: ")[1].split("x")[0])
    assert ratio > 1  # a report run against a shell script that only echoes
    assert FIXTURE.is_file()


def _timings(monkeypatch, calls_before_stop: int) -> None:
    """`_timed` stand-ins: harness.report 2 s, with the plot 3 s, nsys 1 s; then a stop signal."""
    from harness import Terminated

    calls = []

    def timed(cmd, env=None):
        calls.append(cmd)
        if len(calls) > calls_before_stop:
            raise Terminated("SIGTERM")
        wall = 1.0 if "stats" in cmd else 2.0 if "--no-plot" in cmd else 3.0
        return wall, 100.0

    monkeypatch.setattr(bench_report, "_timed", timed)
    monkeypatch.setattr(bench_report, "uncached_modules", lambda: (0, 50))


def test_a_stop_keeps_the_rounds_that_finished(tmp_path, capsys, monkeypatch):
    _timings(monkeypatch, calls_before_stop=6)  # the untimed round and one timed round of three tools
    code = bench_report.main([str(FIXTURE), "--repeat", "3", "--nsys-bin", str(_fake_nsys(tmp_path))])
    out, err = capsys.readouterr()
    assert code == 130
    assert "median 3.000 s over 1 runs (3.00x nsys stats)" in out and "ratio harness/nsys: 3.00x" in out
    assert err == ("error: interrupted: stopped by SIGTERM after 1 of 3 timed rounds; the medians above are over "
                   "those rounds\n")


def test_a_stop_before_a_timed_round_is_one_line(tmp_path, capsys, monkeypatch):
    _timings(monkeypatch, calls_before_stop=4)
    code = bench_report.main([str(FIXTURE), "--repeat", "3", "--nsys-bin", str(_fake_nsys(tmp_path))])
    out, err = capsys.readouterr()
    assert (code, out) == (130, "")
    assert err == "error: interrupted by SIGTERM before a timed round finished; nothing to report\n"
