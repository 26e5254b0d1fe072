"""harness.tune_attention: the ranking arithmetic on known rows, and a tiny search end to end
in interpret mode on CPU (failures recorded, rows appended, rendering from the file)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from harness import tune_attention
from harness.attention import tune


def _row(pass_, seq, candidate, ms, status="ok", causal=True, spread=0.01):
    """One measurement; its repeats range `spread` either side of the median."""
    return {"pass": pass_, "candidate": candidate, "batch": 1, "heads": 2, "seq": seq, "head_dim": 64,
            "dtype": "bfloat16", "causal": causal, "status": status, "ms": ms, "tflops": 1.0,
            "ms_spread": None if ms is None else [ms * (1 - spread), ms * (1 + spread)]}


def test_baseline_is_the_faster_default_measurement() -> None:
    rows = [_row("fwd", 1024, "default", 3.0), _row("fwd", 1024, "a", 2.0), _row("fwd", 1024, tune.AGAIN, 2.5)]
    got = {g["candidate"]: g for g in tune.rank(rows)}
    assert math.isclose(got["a"]["geomean"], 1.25)
    assert math.isclose(got["default"]["geomean"], 2.5 / 3.0)


def test_rank_is_geomean_over_shapes_where_both_ran() -> None:
    rows = [_row("fwd", 1024, "default", 2.0), _row("fwd", 4096, "default", 8.0),
            _row("fwd", 1024, "a", 1.0), _row("fwd", 4096, "a", 12.0),        # 2x and 2/3x -> geomean sqrt(4/3)
            _row("fwd", 1024, "b", 1.6), _row("fwd", 4096, "b", None, "OOM"),  # 1.25x on the one it ran
            _row("bwd", 1024, "default", 3.0), _row("bwd", 1024, "c", 2.0)]
    got = {(g["pass"], g["candidate"]): g for g in tune.rank(rows)}
    assert math.isclose(got["fwd", "a"]["geomean"], math.sqrt(4 / 3))
    assert math.isclose(got["fwd", "a"]["worst"], 2 / 3) and (got["fwd", "a"]["best"], got["fwd",
                                                                                           "a"]["cells"]) == (2.0, 2)
    assert math.isclose(got["fwd", "b"]["geomean"], 1.25) and got["fwd", "b"]["failed"] == 1
    assert math.isclose(got["bwd", "c"]["geomean"], 1.5)
    # Best first within a pass.
    assert [g["candidate"] for g in tune.rank(rows) if g["pass"] == "fwd"] == ["b", "a", "default"]
    best = {(b["pass"], b["seq"]): b for b in tune.best_per_cell(rows)}
    assert best["fwd", 1024]["candidate"] == "a" and best["fwd", 1024]["speedup"] == 2.0
    assert best["fwd", 4096]["candidate"] == "default" and best["fwd", 4096]["speedup"] == 1.0


def test_rel_diff_is_max_abs_difference_over_reference_scale() -> None:
    ref = (np.array([1.0, -4.0]), np.array([0.5]))
    got = (np.array([1.0, -3.9]), np.array([0.5]))
    assert math.isclose(tune._rel_diff(got, ref), 0.1 / 4.0, rel_tol=1e-5)


def test_bad_passes_are_refused() -> None:
    with pytest.raises(SystemExit):
        tune_attention.parse_args(["--passes", "fwd,sideways"])


def test_tiny_search_end_to_end(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(tune.CANDIDATES, ("triton", "fwd"), [{}, {"block_k": 32}, {"block_q": 48}])
    monkeypatch.setitem(tune.CANDIDATES, ("triton", "bwd"), [{}, {"block_q_dq": 32}])
    argv = ["--kernel", "triton", "--device", "cpu", "--shapes", "grid", "--seq", "40", "--head-dim", "16",
            "--heads", "2", "--dtype", "fp32", "--causal", "true", "--iters", "1", "--warmup", "0",
            "--min-batch-ms", "0", "--lead-in-ms", "0", "--out", str(tmp_path), "--name", "t"]
    assert tune_attention.main(argv) == 0
    rows, env = tune.read_rows(tmp_path / "t.jsonl")
    assert env["device"] == "cpu"
    assert [(r["pass"], r["candidate"]) for r in rows] == [
        ("fwd", "default"), ("fwd", "block_k=32"), ("fwd", "block_q=48"), ("fwd", "default (again)"),
        ("bwd", "default"), ("bwd", "block_q_dq=32"), ("bwd", "default (again)")]
    bad = rows[2]
    # The repeat of the default is checked against the first run: the kernel is deterministic.
    assert rows[3]["rel_diff_vs_default"] == 0.0
    assert bad["status"].startswith("unsupported") and "power of two" in bad["status"]
    # Other tiles, same numbers: float32 differences stay far inside the tolerance.
    assert rows[1]["status"] == "ok" and rows[1]["rel_diff_vs_default"] < 1e-5
    assert rows[5]["status"] == "ok" and rows[5]["rel_diff_vs_default"] < 1e-5
    assert rows[1]["block_sizes"]["block_k"] == 32
    md = (tmp_path / "t.md").read_text()
    assert "| fwd | 16 | block_q=48 | - | - | - | 0 | 1 |" in md
    (tmp_path / "t.md").unlink()
    assert tune_attention.main(["--render", str(tmp_path / "t.jsonl")]) == 0
    assert (tmp_path / "t.md").read_text() == md
    assert json.loads((tmp_path / "t.jsonl").read_text().splitlines()[1])["pass"] == "fwd"


def test_only_keeps_the_candidates_that_set_the_field(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(tune.CANDIDATES, ("triton", "fwd"), [{}, {"block_k": 32}, {"block_q": 32, "block_k": 16}])
    argv = ["--kernel", "triton", "--passes", "fwd", "--device", "cpu", "--shapes", "grid", "--seq", "40",
            "--head-dim", "16", "--heads", "1", "--dtype", "fp32", "--causal", "true", "--iters", "1",
            "--warmup", "0", "--min-batch-ms", "0", "--lead-in-ms", "0", "--out", str(tmp_path), "--name", "t",
            "--only", "block_q"]
    assert tune_attention.main(argv) == 0
    rows, _ = tune.read_rows(tmp_path / "t.jsonl")
    assert [r["candidate"] for r in rows] == ["default", "block_q=32 block_k=16", "default (again)"]
    with pytest.raises(SystemExit):
        tune_attention.parse_args(["--kernel", "triton", "--passes", "fwd", "--only", "overlap"])


def test_candidates_equal_to_the_default_are_skipped() -> None:
    from pallas_kernels import MosaicBlockSizes

    seen: list = []
    cell = {"head_dim": 128, "seq": 4096, "causal": True}
    default = MosaicBlockSizes.get_default(128)
    assert not tune._repeats("mosaic", cell, {}, seen)
    assert tune._repeats("mosaic", cell, {"num_stages": default.num_stages}, seen)
    assert not tune._repeats("mosaic", cell, {"num_stages": default.num_stages + 1}, seen)
    assert not tune._repeats("mosaic", cell, {"block_k_dq": 48}, seen)  # invalid: measured, recorded as failed
    # The default depends on the length: at head_dim 64 and seq 1024 it is
    # the two-kernel backward, at 4096 the fused one.
    short, long_ = {"head_dim": 64, "seq": 1024, "causal": True}, {"head_dim": 64, "seq": 4096, "causal": True}
    seen_short: list = []
    seen_long: list = []
    assert not tune._repeats("mosaic", short, {}, seen_short)
    assert tune._repeats("mosaic", short, {"fused_bwd": False}, seen_short)
    assert not tune._repeats("mosaic", long_, {}, seen_long)
    assert not tune._repeats("mosaic", long_, {"fused_bwd": False}, seen_long)


def test_the_answer_names_each_pass_best_candidate() -> None:
    rows = [_row("fwd", 1024, "default", 2.0), _row("fwd", 1024, "a", 1.0), _row("fwd", 4096, "default", 8.0),
            _row("fwd", 4096, "a", 12.0), _row("bwd", 1024, "default", 3.0), _row("bwd", 1024, "c", 4.0),
            _row("bwd", 4096, "c", None, "OOM")]
    texts = [f.text for f in tune.tune_findings(rows)]
    assert texts == [  # fwd: a is 2x and 2/3x, geomean sqrt(4/3) = 1.155; bwd: c is slower
        "bwd, head dim 64: the default is the best candidate",
        "bwd, head dim 64: faster than the default beyond the noise: none",
        "fwd, head dim 64: best: a, 1.155x the default's speed (geomean over 2 shapes; worst shape 0.667x, "
        "best 2.000x)",
        "fwd, head dim 64: faster than the default beyond the noise: a at 1x1024x2x64 causal (2.000x)",
        "1 of 7 measurements did not run or did not match",
    ]
    assert tune.tune_markdown(rows).splitlines()[2] == "## The answer"
    # One shape searched: no geomean, worst or best to speak of.
    one = [_row("bwd", 1024, "default", 1.0), _row("bwd", 1024, "d", 0.8)]
    assert tune.tune_findings(one)[0].text == "bwd, head dim 64: best: d, 1.250x the default's speed (one shape)"


def test_multicast_is_skipped_where_the_forward_runs_without_it() -> None:
    """K/V multicast changes nothing on a causal cell or where a head's query tiles do not pair
    (seq 2048 in 192-row tiles: 11); there the candidate repeats the default and is not timed."""
    for seq, causal, timed in ((4096, True, False), (2048, False, False), (4096, False, True)):
        seen: list = []
        cell = {"head_dim": 64, "seq": seq, "causal": causal}
        assert not tune._repeats("mosaic", cell, {"kv_multicast": False}, seen)
        assert tune._repeats("mosaic", cell, {"kv_multicast": True}, seen) is not timed, (seq, causal)


def test_beyond_the_noise_needs_the_candidate_s_range_below_every_default_measurement() -> None:
    """2% faster with repeats within 1%: apart from a default measured at 1.00 +- 1%, not from
    one whose second measurement ranged down to 0.97; and the committed multicast search, whose
    ranges all overlap the default's, has none."""
    rows = [_row("fwd", 1024, "default", 1.0), _row("fwd", 1024, "a", 0.98, spread=0.005)]
    assert [r["candidate"] for r in tune.beyond_noise(rows)] == ["a"]
    assert tune.beyond_noise([*rows, _row("fwd", 1024, tune.AGAIN, 1.0, spread=0.03)]) == []
    committed = Path(__file__).resolve().parents[1] / "results/attention/kv-multicast-h200/multicast-fwd.jsonl"
    assert tune.beyond_noise(tune.read_rows(committed)[0]) == []
