"""harness.bench_optimizer: the loop, foreach and fused AdamW timed on a model's parameters."""

from __future__ import annotations

import json

import pytest

from harness import bench_optimizer
from harness.config import get_config
from harness.timing.flops import optimizer_bytes


def test_bench_optimizer_on_cpu(tmp_path, capsys) -> None:
    out = tmp_path / "opt.json"
    assert bench_optimizer.main(["--model", "tiny", "--device", "cpu", "--variants", "loop,foreach,fused",
                                 "--warmup", "1", "--steps", "2", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["variants"]) == {"loop", "foreach", "fused"}
    assert doc["bytes_per_step"] == optimizer_bytes(get_config("tiny"))
    loop, foreach = doc["variants"]["loop"], doc["variants"]["foreach"]
    assert loop["speedup_over_loop"] == 1.0 and len(loop["times_ms"]) == 2
    assert foreach["speedup_over_loop"] == loop["median_ms"] / foreach["median_ms"]
    assert foreach["gb_per_s"] == doc["bytes_per_step"] / (foreach["median_ms"] / 1e3) / 1e9
    assert "x loop" in capsys.readouterr().out


def test_bench_optimizer_rejects_unknown_variant(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        bench_optimizer.main(["--model", "tiny", "--device", "cpu", "--variants", "adam"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "variant" in err and "loop, foreach, foreach-compiled, fused" in err and "Traceback" not in err
