"""The attention benchmark's answer, counted by hand from a small table."""

from __future__ import annotations

from harness.attention.bench_answer import bench_findings


def _row(impl: str, seq: int, fwd_ms: float, spread: tuple[float, float], xbest: float | None,
         status: str = "ok") -> dict:
    return {"impl": impl, "batch": 1, "heads": 16, "seq": seq, "head_dim": 64, "dtype": "bfloat16", "causal": True,
            "status": status, "fwd_ms": fwd_ms, "fwd_ms_spread": list(spread), "fwd_tflops": 100 / fwd_ms if fwd_ms else None,
            "fwd_speedup_vs_best": xbest, "fwd_best_ref": "jax_cudnn" if xbest is not None else None}


def test_counts_noise_and_the_lowest_cell() -> None:
    rows = [
        _row("jax_cudnn", 1024, 1.00, (0.98, 1.02), 1.0),
        _row("pallas_mosaic", 1024, 0.95, (0.94, 0.96), 1.00 / 0.95),  # faster
        _row("jax_cudnn", 2048, 2.00, (1.98, 2.02), 1.0),
        _row("pallas_mosaic", 2048, 2.01, (1.99, 2.03), 2.00 / 2.01),  # slower within the noise
        _row("jax_cudnn", 4096, 4.00, (3.98, 4.02), 1.0),
        _row("pallas_mosaic", 4096, 4.40, (4.30, 4.50), 4.00 / 4.40),  # slower beyond it
        _row("pallas_mosaic", 8192, 0.0, (0.0, 0.0), None, status="OOM"),
    ]
    texts = [f.text for f in bench_findings(rows)]
    assert texts[0] == ("pallas_mosaic: at least as fast as the fastest reference in 1 of 3 cell-passes, slower "
                        "beyond the noise in 1; its lowest: forward at 0.91x (1x16x4096x64 causal, against jax_cudnn)")
    assert texts[1] == "highest forward throughput: 105 TFLOP/s, pallas_mosaic at 1x16x1024x64 causal"
    assert texts[-1] == "1 of 7 rows did not run: pallas_mosaic 1x16x8192x64 causal: OOM"
