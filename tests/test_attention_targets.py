"""harness.attention_targets: ratios and verdicts on hand-made benchmark rows."""

from __future__ import annotations

import json

import pytest

from harness import attention_targets
from harness.attention import targets


def _row(impl: str, seq: int, fwd: float, bwd: float, status: str = "ok", dtype: str = "bfloat16",
         batch: int = 1, heads: int = 16) -> dict:
    ok = status == "ok"
    return {"impl": impl, "dtype": dtype, "head_dim": 64, "seq": seq, "causal": True, "status": status,
            "batch": batch, "heads": heads, "fwd_ms": fwd if ok else None, "bwd_ms": bwd if ok else None,
            "fwd_bwd_ms": fwd + bwd if ok else None}


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
    assert attention_targets.main([str(path)]) == 0
    md = capsys.readouterr().out
    assert "as fast as JAX Pallas `mha` (ratio <= 1): 1 of 2 cell-passes" in md
    assert "within 1.5x of the fastest torch SDPA at seq >= 1024, bf16: 0 of 2 cell-passes" in md
    assert attention_targets.main([str(path), "--impl", "nope"]) == 2 and "no 'nope' rows" in capsys.readouterr().err


def test_bench_ratio_columns() -> None:
    """bench_attention's own columns: time over the fastest SDPA backend, and the
    fastest of SDPA and JAX cuDNN over this time (OOM rows ignored)."""
    from harness.attention import bench as bench_attention

    def full(r: dict) -> dict:
        ok = r["status"] == "ok"
        return {**r, "heads": 16, "batch": 1, "fwd_bwd_ms": r["fwd_ms"] + r["bwd_ms"] if ok else None}

    rows = [full(r) for r in ROWS[:5]] + [full(_row("jax_cudnn", 4096, 1.2, 5.0))]
    bench_attention.add_sdpa_ratios(rows)
    bench_attention.add_best_ref_speedups(rows)
    pallas = rows[0]
    assert pallas["fwd_vs_sdpa"] == 2.0 and pallas["bwd_vs_sdpa"] == 2.0  # 3.0/1.5, 4.0/2.0
    assert pallas["fwd_speedup_vs_best"] == pytest.approx(0.4) and pallas["fwd_best_ref"] == "jax_cudnn"  # 1.2/3.0
    assert pallas["bwd_speedup_vs_best"] == pytest.approx(0.5) and pallas["bwd_best_ref"] == "torch_sdpa_flash"
    assert rows[4]["fwd_vs_sdpa"] is None  # the OOM row has no ratio


def test_hopper_targets_and_leaderboard(tmp_path, capsys) -> None:
    rows = [_row("pallas_mosaic", 4096, 2.0, 3.0), _row("torch_sdpa_cudnn", 4096, 1.6, 3.3),
            _row("jax_cudnn", 4096, 2.2, 3.0), _row("torch_sdpa_flash", 4096, 1.0, 1.0, status="oom"),
            # The leaderboard shape and a cell of the same seq but other batch/heads stay apart.
            _row("pallas_mosaic", 16384, 1.5, 3.5, batch=16, heads=1), _row("torch_sdpa_cudnn", 16384, 1.2, 3.2,
                                                                            batch=16, heads=1),
            _row("pallas_mosaic", 16384, 9.0, 9.0, batch=1, heads=32), _row("jax_cudnn", 16384, 9.9, 9.9, batch=1,
                                                                            heads=32)]
    got = {(r["seq"], r["batch"], r["pass"]): r for r in targets.check_hopper(rows)}
    assert got[(4096, 1, "fwd")]["speedup"] == 0.8 and got[(4096, 1, "fwd")]["best_ref"] == "torch_sdpa_cudnn"
    assert got[(4096, 1, "fwd")]["meets"] is False
    assert got[(4096, 1, "bwd")]["speedup"] == 1.0 and got[(4096, 1, "bwd")]["best_ref"] == "jax_cudnn"
    assert got[(4096, 1, "bwd")]["meets"] is True
    assert got[(16384, 1, "fwd")]["speedup"] == pytest.approx(1.1) and got[(16384, 1, "fwd")]["best_ref"] == "jax_cudnn"
    # fwd+bwd: the fastest reference's 4.9 ms (torch, 1.6 + 3.3) over our 5.0 ms.
    assert got[(4096, 1, "fwd_bwd")]["speedup"] == pytest.approx(0.98) and got[(4096, 1, "fwd_bwd")]["meets"] is False
    board = targets.leaderboard(targets.check_hopper(rows))
    # 5.0 ms against torch's 4.4 ms: 1.136x its time, past the target of 0.95x.
    assert board["ms"] == 5.0 and board["best_ref_ms"] == pytest.approx(4.4)
    assert board["time_ratio"] == pytest.approx(5.0 / 4.4) and board["meets"] is False
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"results": rows}))
    assert attention_targets.main(["--targets", "hopper", str(path)]) == 0
    md = capsys.readouterr().out
    # fwd: 4096 misses (0.8x), the leaderboard cell 0.8x, 16384 x 32 1.1x; fwd+bwd: 0.98x, 0.88x, 1.1x.
    assert "forward and forward+backward each >= 1.0x the fastest reference: 2 of 6 cell-passes" in md
    assert "the backward alone >= 1.0x: 2 of 3 cells" in md
    assert ("forward+backward: 5.00 ms, 1.136x the time of the fastest reference (torch_sdpa_cudnn 4.40 ms); "
            "target <= 0.95x: not met") in md
    # A miss reads as one, however close: 0.8x below, 0.980x below; 1.0x stays plain.
    assert "| 1 | 16 | 4096 | 64 | yes | 0.800x below | 1.00x | 0.980x below |" in md


def test_leaderboard_met_at_the_time_ratio() -> None:
    """At 0.95x the fastest reference's time the leaderboard target holds; just above, it does not."""
    def board(ours_ms: float) -> dict:
        rows = [_row("pallas_mosaic", 16384, ours_ms / 2, ours_ms / 2, batch=16, heads=1),
                _row("jax_cudnn", 16384, 2.0, 2.0, batch=16, heads=1)]
        return targets.leaderboard(targets.check_hopper(rows))

    assert board(3.8)["meets"] is True and board(3.8)["time_ratio"] == pytest.approx(0.95)
    assert board(3.81)["meets"] is False
    assert targets.leaderboard(targets.check_hopper([_row("pallas_mosaic", 16384, 1.0, 1.0, batch=16,
                                                          heads=1)])) is None  # no reference: no verdict


def test_a_near_miss_is_not_rounded_to_a_pass(tmp_path, capsys) -> None:
    rows = [_row("pallas_mosaic", 4096, 1.004, 0.996), _row("torch_sdpa_cudnn", 4096, 1.0, 1.0)]
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"results": rows}))
    assert attention_targets.main(["--targets", "hopper", str(path)]) == 0
    md = capsys.readouterr().out
    assert "| 0.996x below | 1.00x |" in md  # fwd 1.0/1.004 misses, bwd 1.0/0.996 passes
    assert "each >= 1.0x the fastest reference: 1 of 2 cell-passes" in md  # fwd+bwd 2.0/2.0 passes


def test_a_later_run_replaces_whole_cells(tmp_path, capsys) -> None:
    """Files are oldest first; a cell measured again is taken from the last
    run with every implementation, so a reference the new run left out does
    not linger from the old one, and cells only the old run has stay."""
    old = [_row("pallas_mosaic", 4096, 2.0, 3.0), _row("torch_sdpa_flash", 4096, 1.0, 1.0),
           _row("pallas_mosaic", 8192, 4.0, 6.0), _row("torch_sdpa_cudnn", 8192, 5.0, 5.0)]
    new = [_row("pallas_mosaic", 4096, 1.8, 2.5), _row("torch_sdpa_cudnn", 4096, 2.0, 2.6)]
    rows = targets.latest_cells([old, new])
    assert sorted((r["seq"], r["impl"]) for r in rows) == [
        (4096, "pallas_mosaic"), (4096, "torch_sdpa_cudnn"), (8192, "pallas_mosaic"), (8192, "torch_sdpa_cudnn")]
    got = {(r["seq"], r["pass"]): r for r in targets.check_hopper(rows)}
    assert got[(4096, "fwd")]["speedup"] == pytest.approx(2.0 / 1.8) and got[(4096, "bwd")]["ms"] == 2.5
    assert got[(8192, "fwd")]["speedup"] == pytest.approx(1.25)
    paths = [tmp_path / "old.json", tmp_path / "new.json"]
    for path, run in zip(paths, (old, new)):
        path.write_text(json.dumps({"results": run}))
    assert attention_targets.main(["--targets", "hopper", *map(str, paths)]) == 0
    md = capsys.readouterr().out
    assert "From `old.json`, `new.json` (a cell in several: the last)." in md
    # 4096: fwd 2.0/1.8, fwd+bwd 4.6/4.3; 8192: fwd 5.0/4.0, fwd+bwd 10.0/10.0.
    assert "forward and forward+backward each >= 1.0x the fastest reference: 4 of 4 cell-passes" in md
    assert "the backward alone >= 1.0x: 1 of 2 cells" in md


def test_against_baseline_ratios_and_noise() -> None:
    """Time now over time in the baseline per cell and pass; spreads that do not overlap are apart."""
    base = [dict(_row("pallas_mosaic", 4096, 2.0, 4.0), fwd_ms_spread=[1.9, 2.1], bwd_ms_spread=[3.9, 4.1])]
    now = [dict(_row("pallas_mosaic", 4096, 2.04, 5.0), fwd_ms_spread=[2.0, 2.2], bwd_ms_spread=[4.8, 5.2]),
           _row("pallas_mosaic", 8192, 1.0, 1.0)]  # a cell the baseline lacks is left out
    got = {r["pass"]: r for r in targets.against_baseline(now, base, "pallas_mosaic")}
    assert set(got) == {"fwd", "bwd"}
    assert got["fwd"]["ratio"] == pytest.approx(1.02) and got["fwd"]["overlap"] is True
    assert got["bwd"]["ratio"] == pytest.approx(1.25) and got["bwd"]["overlap"] is False
    text = targets.render_baseline_markdown(list(got.values()), ["old.json"], "pallas_mosaic")
    assert "1.020-1.250" in text and "overlap in 1 of 2" in text and "1.250 apart" in text


def test_baseline_option_end_to_end(tmp_path, capsys) -> None:
    run = {"results": [dict(_row("pallas_mosaic", 4096, 2.0, 4.0), fwd_ms_spread=[1.9, 2.1],
                            bwd_ms_spread=[3.9, 4.1]), _row("torch_sdpa_cudnn", 4096, 2.2, 4.4)]}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    assert attention_targets.main([str(path), "--targets", "hopper", "--baseline", str(path)]) == 0
    out = capsys.readouterr().out
    assert "against the baseline" in out and "1.000-1.000" in out and "overlap in 2 of 2" in out
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert attention_targets.main([str(path), "--targets", "hopper", "--baseline", str(bad)]) == 2
