"""The scaling table on hand-made result documents, efficiencies counted by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import scaling
from harness.timing.scaling import format_scaling, scaling_rows


def _doc(backend: str, n: int, step_ms: float, status: str = "ok") -> dict:
    options = {"backend": backend, "model": "large", "ctx": 1024, "batch": 4, "dtype": "bf16",
               "attention": "naive", "device": "cuda", "parallel": "ddp", "data_parallel": n}
    doc = {"status": status, "options": options, "phases": {"step": {"median_ms": step_ms}}}
    if n > 1:
        # rank 0's own step is faster than the slowest rank's, which sets the pace
        doc["phases"]["step"]["median_ms"] = step_ms / 2
        doc["data_parallel"] = {"n": n, "step_ms": step_ms}
    return doc


def test_efficiency_by_hand() -> None:
    docs = [_doc("torch", 2, 125.0), _doc("torch", 1, 100.0), _doc("torch", 4, 160.0),
            _doc("jax", 2, 100.0), _doc("torch", 8, 1.0, status="oom")]
    rows = scaling_rows(docs)
    assert [(r["backend"], r["n"]) for r in rows] == [("jax", 2), ("torch", 1), ("torch", 2), ("torch", 4)]
    by_n = {r["n"]: r for r in rows if r["backend"] == "torch"}
    assert by_n[1]["tokens_per_s"] == pytest.approx(4 * 1024 / 0.1)
    assert by_n[2]["tokens_per_s"] == pytest.approx(2 * 4 * 1024 / 0.125)
    assert by_n[2]["efficiency"] == pytest.approx(100 / 125)  # 2x the tokens in 1.25x the time
    assert by_n[4]["efficiency"] == pytest.approx(100 / 160)
    assert rows[0]["efficiency"] is None  # jax has no N = 1 run
    text = format_scaling(rows)
    assert "| torch | large ctx 1024 batch 4/device bf16 naive cuda | ddp | 4 | 160.000 | 102400 | 62.5% |" in text
    assert "| jax | large ctx 1024 batch 4/device bf16 naive cuda | ddp | 2 | 100.000 | 81920 | - |" in text


def test_two_runs_of_one_point_are_refused() -> None:
    with pytest.raises(ValueError, match="N = 2"):
        scaling_rows([_doc("torch", 2, 1.0), _doc("torch", 2, 2.0)])


def test_entry_point(tmp_path: Path, capsys) -> None:
    paths = []
    for i, doc in enumerate([_doc("torch", 1, 100.0), _doc("torch", 2, 110.0)]):
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(json.dumps(doc))
    assert scaling.main([str(p) for p in paths]) == 0
    assert "90.9%" in capsys.readouterr().out
    (tmp_path / "bad.json").write_text("{")
    assert scaling.main([str(tmp_path / "bad.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {tmp_path / 'bad.json'}: not JSON")
