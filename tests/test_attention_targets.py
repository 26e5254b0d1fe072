"""harness.attention_targets: ratios and verdicts on hand-made benchmark rows."""

from __future__ import annotations

import json

from harness import attention_targets as targets


def _row(impl: str, seq: int, fwd: float, bwd: float, status: str = "ok", dtype: str = "bfloat16") -> dict:
    return {"impl": impl, "dtype": dtype, "head_dim": 64, "seq": seq, "causal": True, "status": status,
            "fwd_ms": fwd if status == "ok" else None, "bwd_ms": bwd if status == "ok" else None}


ROWS = [
    _row("pallas", 4096, 3.0, 4.0), _row("jax_pallas_mha", 4096, 4.0, 2.0),
    _row("torch_sdpa_flash", 4096, 2.5, 2.0), _row("torch_sdpa_cudnn", 4096, 1.5, 3.0),
    _row("torch_sdpa_efficient", 4096, 1.0, 1.0, status="oom"),
    _row("pallas", 512, 1.0, 1.0), _row("torch_sdpa_flash", 512, 0.1, 0.1),  # below the SDPA target's seq
]


def test_ratios_and_verdicts() -> None:
    got = {(r["seq"], r["pass"]): r for r in targets.check(ROWS)}
    fwd, bwd = got[(4096, "fwd")], got[(4096, "bwd")]
    assert fwd["vs_mha"] == 0.75 and fwd["meets_mha"] is True
    assert bwd["vs_mha"] == 2.0 and bwd["meets_mha"] is False
    # Fastest SDPA that ran (the OOM backend is ignored): fwd 1.5 ms (cudnn), bwd 2.0 ms (flash).
    assert fwd["vs_sdpa"] == 2.0 and fwd["meets_sdpa"] is False
    assert bwd["vs_sdpa"] == 2.0 and bwd["meets_sdpa"] is False
    short = got[(512, "fwd")]
    assert short["vs_sdpa"] == 10.0 and short["meets_sdpa"] is None  # target does not apply
    assert short["vs_mha"] is None and short["meets_mha"] is None  # no mha row


def test_markdown_counts_and_cli(tmp_path, capsys) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"results": ROWS}))
    assert targets.main([str(path)]) == 0
    md = capsys.readouterr().out
    assert "as fast as JAX Pallas `mha` (ratio <= 1): 1 of 2 cell-passes" in md
    assert "within 1.5x of the fastest torch SDPA at seq >= 1024, bf16: 0 of 2 cell-passes" in md
    assert targets.main([str(path), "--impl", "nope"]) == 2 and "no 'nope' rows" in capsys.readouterr().err
