"""harness.ncu on a real Nsight Compute export of the portable forward kernel."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import ncu as ncu_cli
from harness.attention import ncu_details as ncu

FIXTURE = Path(__file__).parent / "data" / "ncu" / "flash_attention_fwd_d64.csv"


def test_launches_and_metrics_are_read() -> None:
    launches = ncu.read_details(FIXTURE)
    assert [x.kernel for x in launches] == ["flash_attention_fwd", "flash_attention_fwd"]
    first = launches[0]
    assert first.grid == "(32, 1, 16)" and first.block == "(256, 1, 1)"
    assert first.value("Launch Statistics", "Registers Per Thread") == 127
    assert first.value("GPU Speed Of Light Throughput", "Duration") == 142752
    assert first.value("Occupancy", "Theoretical Occupancy") == 25


def test_summary_derives_active_over_elapsed_and_keeps_units() -> None:
    s = ncu.summary(ncu.read_details(FIXTURE)[0])
    # 178,254.11 SM active cycles of 252,504 elapsed.
    assert s["SM active / elapsed cycles"] == "71%"
    assert s["registers per thread"] == "127 register/thread"
    assert s["local-memory spill requests"] == "0"
    # The clock the kernel ran at and the work it issued: comparing two
    # kernels under a power cap needs both.
    assert s["SM frequency"] == "1,754,633,910.56 hz" and s["elapsed cycles"] == "252,504 cycle"
    assert s["executed instructions"] == "60,216,192 inst"
    md = ncu.ncu_markdown([s], FIXTURE.name)
    assert "| theoretical occupancy | 25% |" in md and "| achieved occupancy | 22.80% |" in md


def test_a_file_that_is_not_an_ncu_export_is_refused(tmp_path, capsys) -> None:
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ncu.NcuError, match="--page details"):
        ncu.read_details(bad)
    assert ncu_cli.main([str(bad)]) == 2 and "not an ncu details CSV" in capsys.readouterr().err


MOSAIC = Path(__file__).parent / "data" / "ncu" / "mosaic_d128.csv"


def test_tensor_pipe_and_stalls_from_raw_metrics() -> None:
    fwd, dkdv, dq = ncu.read_details(MOSAIC)
    assert dkdv.kernel == "flash_attention_mgpu_bwd_dkdv_mosaic_gpu_kernel"
    # Largest stall reasons first; 'selected' (issuing) is not a stall.
    top = ncu.stalls(dkdv)
    assert top[:3] == [("long_scoreboard", 3.38), ("barrier", 2.54), ("wait", 1.11)]
    assert "selected" not in dict(top)
    s = ncu.summary(fwd)
    assert s["tensor pipe active"] == "66.5% of active cycles"
    assert s["top stalls (cycles per issue)"] == "long_scoreboard 3.83, wait 1.60, barrier 0.85"
    # The dK/dV kernel at head_dim 128 spills; the others do not.
    assert [ncu.summary(x)["local-memory spill requests"] for x in (fwd, dkdv, dq)] == ["0", "290,688", "0"]


def test_without_raw_metrics_the_rows_are_left_out() -> None:
    s = ncu.summary(ncu.read_details(FIXTURE)[0])
    assert "tensor pipe active" not in s and "top stalls (cycles per issue)" not in s
    # A section that was not collected (InstructionStats here) leaves its rows out too.
    assert "executed instructions" not in ncu.summary(ncu.read_details(MOSAIC)[0])
