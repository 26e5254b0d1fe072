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
