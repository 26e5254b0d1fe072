"""Roofline of real ncu exports: the FLOPs it estimates match the kernels' analytic work."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import ncu as ncu_cli
from harness.attention import roofline
from harness.attention.ncu_details import read_details

DATA = Path(__file__).parent / "data" / "ncu"
MOSAIC = DATA / "mosaic_d128.csv"  # Hopper kernels, bf16, causal, 1x4096x16x128, on an H200
PORTABLE = DATA / "flash_attention_fwd_d64.csv"  # --set full only: no tensor-pipe metric


def _causal_matmul_flops(batch=1, seq=4096, heads=16, d_head=128) -> float:
    """One T x T x D product over the causal half."""
    return 2 * batch * heads * seq * seq * d_head / 2


def test_flops_match_the_attention_products() -> None:
    pts = roofline.points(read_details(MOSAIC), roofline.compute_capabilities(MOSAIC))
    # forward: QK^T and PV; dK/dV: S, dV, dP, dK; dQ: S, dP, dQ.
    for p, products in zip(pts, (2, 4, 3)):
        assert p.flops == pytest.approx(products * _causal_matmul_flops(), rel=0.06), p.kernel
    fwd = pts[0]
    assert fwd.seconds == pytest.approx(149.024e-6)
    assert fwd.dram_bytes == pytest.approx(402_717_629_375.13 * 149.024e-6)
    r = roofline.roofs("H200")
    assert r.ridge(r.tensor_tflops) == pytest.approx(989.4 / 4.8)
    assert fwd.intensity > r.ridge(r.tensor_tflops)  # compute side of the ridge
    assert 0.4 < fwd.flops_per_s / r.roof(fwd.intensity, r.tensor_tflops) < 0.6


def test_cli_writes_table_and_plot(tmp_path, capsys) -> None:
    assert ncu_cli.main(["--roofline", "--gpu", "H200", str(MOSAIC), "--out", str(tmp_path)]) == 0
    text = (tmp_path / "roofline.md").read_text()
    assert "Metrics used:" in text and roofline.TENSOR_PIPE in text and "| #2 |" in text
    assert (tmp_path / "roofline.png").stat().st_size > 10_000


def test_export_without_flop_counters_is_refused_in_one_line(capsys) -> None:
    assert ncu_cli.main(["--roofline", "--gpu", "H200", str(PORTABLE)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no FLOP counters" in err and "--metrics" in err and roofline.TENSOR_PIPE in err
    assert ncu_cli.main(["--roofline", str(MOSAIC)]) == 2 and "--gpu" in capsys.readouterr().err
    assert ncu_cli.main(["--roofline", "--gpu", "V100", str(MOSAIC)]) == 2
