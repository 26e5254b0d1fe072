"""The scaling table on hand-made result documents, efficiencies counted by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import scaling
from harness.reports.scaling import format_scaling
from harness.timing.scaling import scaling_rows


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
    # a document without `bucket_mb` predates the per-backend default: DDP's own 25 MB
    assert ("| torch | large ctx 1024 batch 4/device bf16 naive cuda | DDP, 25 MB buckets | 4 | step | 160.000 | "
            "102400 | - | 62.5% |") in text
    assert "| jax | large ctx 1024 batch 4/device bf16 naive cuda | replicated | 2 | step | 100.000 | 81920 | - | - |" \
        in text


def test_jax_takes_its_fused_step_and_mfu_is_per_device() -> None:
    """JAX's fused step, where faster, is its step; MFU is one device's FLOPs over the
    slowest device's step against one device's peak, whatever N."""
    one, four = _doc("jax", 1, 90.0), _doc("jax", 4, 130.0)
    one["phases"]["fused_step"] = {"median_ms": 60.0, "mfu": 0.40}
    # the fused step's own median 35 ms at MFU 0.6 (FLOPs/0.035 s), paced by the slowest device's 70 ms
    four["phases"]["fused_step"] = {"median_ms": 35.0, "mfu": 0.60}
    four["data_parallel"]["spread"] = {"step": {"max_ms": 130.0}, "fused_step": {"max_ms": 70.0}}
    rows = scaling_rows([one, four])
    assert [(r["n"], r["phase"], r["step_ms"]) for r in rows] == [(1, "fused_step", 60.0), (4, "fused_step", 70.0)]
    assert rows[1]["mfu"] == pytest.approx(0.60 * 35 / 70)
    assert rows[1]["efficiency"] == pytest.approx(60 / 70)
    assert rows[1]["parallel"] == "replicated"


def test_loop_step_is_the_slowest_ranks_back_to_back_step() -> None:
    """The loop columns: the overhead check's plain step, the slowest rank's where the
    ranks kept theirs (else the document's, rank 0's or the one process's), and the
    efficiency on it; a run without the check has none."""
    one, four, old, bare = (_doc("torch-compile-cg", 1, 75.0), _doc("torch-compile-cg", 4, 82.0),
                            _doc("torch-compile-cg", 2, 81.0), _doc("jax", 1, 70.0))
    for doc in (four, old):
        doc["data_parallel"]["bucket_mb"] = 250.0
    one["overhead"] = {"plain_step_ms": 66.0}
    four["overhead"] = {"plain_step_ms": 70.0}  # rank 0's; rank 2 was slower
    four["ranks"] = [{"rank": r, "overhead": {"plain_step_ms": ms}} for r, ms in enumerate((70.0, 71.0, 77.0, 72.0))]
    old["overhead"] = {"plain_step_ms": 74.0}
    old["ranks"] = [{"rank": 0}, {"rank": 1}]  # from before the ranks kept their checks
    rows = {(r["backend"], r["n"]): r for r in scaling_rows([one, four, old, bare])}
    assert rows["torch-compile-cg", 4]["loop_ms"] == 77.0
    assert rows["torch-compile-cg", 4]["loop_efficiency"] == pytest.approx(66 / 77)
    assert rows["torch-compile-cg", 4]["efficiency"] == pytest.approx(75 / 82)  # the synchronized step's, unchanged
    assert rows["torch-compile-cg", 2]["loop_ms"] == 74.0
    assert rows["torch-compile-cg", 2]["loop_efficiency"] == pytest.approx(66 / 74)
    assert rows["jax", 1]["loop_ms"] is None and rows["jax", 1]["loop_efficiency"] is None
    text = format_scaling(list(rows.values()))
    assert "| 82.000 | 199805 | - | 91.5% | 77.000 | 85.7% |" in text
    # a loop step slower than the synchronized step (a busier host during the check), or a
    # check that flagged itself, gives no loop efficiency, at N = 1 for every row after it
    one["overhead"] = {"plain_step_ms": 80.0}
    rows = {(r["backend"], r["n"]): r for r in scaling_rows([one, four])}
    assert rows["torch-compile-cg", 1]["loop_doubt"] == "slower than the synchronized step"
    assert rows["torch-compile-cg", 4]["loop_efficiency"] is None
    assert "| 75.000 | 54613 | - | 100.0% | 80.000 * | - |" in format_scaling(list(rows.values()))
    one["overhead"] = {"plain_step_ms": 66.0}
    four["ranks"][1]["overhead"]["flag"] = "ratio below 1 within the rounds' spread"
    rows = {(r["backend"], r["n"]): r for r in scaling_rows([one, four])}
    assert rows["torch-compile-cg", 4]["loop_doubt"] and rows["torch-compile-cg", 4]["loop_efficiency"] is None
    old["overhead"]["flag"] = "ratio below 1 within the rounds' spread"  # only rank 0's check, in the document
    assert {r["n"]: r for r in scaling_rows([one, old])}[2]["loop_doubt"]
    assert "| jax | large ctx 1024 batch 4/device bf16 naive cuda | - | 1 | step | 70.000 | 58514 | - | 100.0% | - | - |" \
        in text


def test_a_row_names_the_strategy_its_run_recorded() -> None:
    """A document's own label names its strategy: JAX's sharded parameters from before the
    collectives were merged stay a row of their own beside today's, and both are set
    against the same one-device run."""
    one, old, new = _doc("jax", 1, 70.0), _doc("jax", 4, 80.0), _doc("jax", 4, 75.0)
    for doc, label in ((old, "sharded parameters (each parameter ...)"),
                       (new, "sharded parameters, collectives merged (each parameter ...; XLA merges ...)")):
        doc["options"]["parallel"] = "fsdp"
        doc["data_parallel"]["label"] = label
    rows = {r["parallel"]: r for r in scaling_rows([one, old, new])}
    assert set(rows) == {"-", "sharded parameters", "sharded parameters, collectives merged"}
    assert rows["sharded parameters"]["efficiency"] == pytest.approx(70 / 80)
    assert rows["sharded parameters, collectives merged"]["efficiency"] == pytest.approx(70 / 75)
    del new["data_parallel"]["label"]  # a document without one: the strategy's label today
    assert scaling_rows([new])[0]["parallel"] == "sharded parameters, collectives merged"


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


def _fit_doc(n: int, step_ms: float, busbw: float | None = 200.0) -> dict:
    doc = _doc("torch", n, step_ms)
    doc["num_params"] = 1_000_000_000  # 4 GB of float32 gradients
    if n > 1 and busbw:
        doc["data_parallel"]["link"] = {"busbw_gbps": busbw}
    return doc


def test_projection_by_hand(tmp_path: Path, capsys) -> None:
    """compute 100 ms (N = 1); at N = 2 the all-reduce of 4 GB at 200 GB/s bus takes
    2(1)/2 x 4e9 / 200e9 = 20 ms and the step 110 ms: half of it hidden. N = 4: 1.5 x 20 =
    30 ms, 15 exposed, step 115 ms, 100/115 = 87.0%. N = 16 on 2 nodes of 8 at 400 Gbit/s
    (50 GB/s) per device: 2(7)/8 x 20 = 35 ms inside + 2(1)/2 x 4e9/8 / 50e9 = 10 ms
    across, 45 ms, 22.5 exposed, step 122.5 ms."""
    from harness.reports.projection import project

    p = project(_fit_doc(1, 100.0), _fit_doc(2, 110.0), [4, 16], inter_gbps=400.0,
                measured=[_fit_doc(4, 118.0)])
    assert p["hidden"] == pytest.approx(0.5)
    four, sixteen = p["rows"]
    assert (four["comm_ms"], four["exposed_ms"], four["step_ms"]) == pytest.approx((30.0, 15.0, 115.0))
    assert four["efficiency"] == pytest.approx(100 / 115) and four["measured_step_ms"] == 118.0
    assert (sixteen["nodes"], sixteen["comm_ms"], sixteen["step_ms"]) == (2, pytest.approx(45.0),
                                                                         pytest.approx(122.5))
    paths = []
    for i, doc in enumerate([_fit_doc(1, 100.0), _fit_doc(2, 110.0), _fit_doc(4, 118.0)]):
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(json.dumps(doc))
    assert scaling.main([*map(str, paths), "--project", "4,16", "--inter-node-gbps", "400"]) == 0
    out = capsys.readouterr().out
    assert "| 4 | 1 | 30.000 | 15.000 | 115.000 | 87.0% | 118.000 | 84.7% |" in out
    assert "step(N) = compute + (1 - hidden) x comm(N) + other" in out and "Assumptions:" in out
    # JAX measures no link: the bandwidth must be given; across nodes, the inter-node one
    (tmp_path / "nolink.json").write_text(json.dumps(_fit_doc(2, 110.0, busbw=None)))
    assert scaling.main([str(paths[0]), str(tmp_path / "nolink.json"), "--project", "4"]) == 2
    assert "--busbw-gbps" in capsys.readouterr().err
    assert scaling.main([*map(str, paths[:2]), "--project", "16"]) == 2
    assert "--inter-node-gbps" in capsys.readouterr().err


def test_projection_keeps_growth_the_all_reduce_cannot_explain() -> None:
    """By hand: compute 100 ms, the N = 2 step 140 ms, its all-reduce 2(1)/2 x 4e9 B / 200e9 B/s
    = 20 ms: none of it hidden and 20 ms more (a straggler's waiting) kept. N = 4: the
    all-reduce 1.5 x 20 = 30 ms, step 100 + 30 + 20 = 150 ms, never below the measured 140."""
    from harness.reports.projection import project

    p = project(_fit_doc(1, 100.0), _fit_doc(2, 140.0), [4], inter_gbps=400.0, busbw_gbps=200.0)
    assert p["hidden"] == 0.0 and p["other_ms"] == pytest.approx(20.0)
    (row,) = p["rows"]
    assert row["step_ms"] == pytest.approx(150.0) and row["efficiency"] == pytest.approx(100 / 150)


def test_options_are_rows_of_their_own_against_the_one_device_run() -> None:
    """Two N = 2 runs of one backend that differ in their DDP options, or in the compiler
    settings they were given (XLA_FLAGS, Inductor's options), are two rows, each against the
    backend's one-device run (the one under the same settings where there is one)."""
    one, default, big = _doc("torch-compile", 1, 80.0), _doc("torch-compile", 2, 100.0), _doc("torch-compile", 2, 120.0)
    default["data_parallel"]["bucket_mb"] = 250.0  # recorded by the run: the compiled backends' default
    big["options"].update(ddp_bucket_mb=25.0, ddp_static_graph=True, grad_comm="bf16")
    jax1, jax2, jax2_flags = _doc("jax", 1, 60.0), _doc("jax", 2, 75.0), _doc("jax", 2, 64.0)
    jax2_flags["env"] = {"settings": {"XLA_FLAGS": "--xla_x=true"}}
    rows = scaling_rows([one, default, big, jax1, jax2, jax2_flags])
    got = {(r["backend"], r["parallel"], r["n"]): r["efficiency"] for r in rows}
    assert got == pytest.approx({
        ("jax", "-", 1): 1.0, ("jax", "replicated", 2): 60 / 75, ("jax", "replicated, XLA_FLAGS=--xla_x=true", 2): None,
        ("torch-compile", "-", 1): 1.0, ("torch-compile", "DDP, 250 MB buckets", 2): 80 / 100,
        ("torch-compile", "DDP, 25 MB buckets, static graph, bf16 gradients", 2): 80 / 120})
    jax1_flags = _doc("jax", 1, 55.0)
    jax1_flags["env"] = jax2_flags["env"]
    got = {(r["parallel"], r["n"]): r["efficiency"] for r in scaling_rows([jax1, jax1_flags, jax2_flags])}
    assert got[("replicated, XLA_FLAGS=--xla_x=true", 2)] == pytest.approx(55 / 64)
    # JAX's numerics options are settings too; where it caches and which platform it runs on are not
    jax2_prec = _doc("jax", 2, 70.0)
    jax2_prec["env"] = {"settings": {"JAX_DEFAULT_MATMUL_PRECISION": "float32", "JAX_COMPILATION_CACHE_DIR": "c",
                                     "JAX_PLATFORMS": "cpu"}}
    assert {(r["parallel"], r["n"]): r["efficiency"] for r in scaling_rows([jax1, jax2_prec])} == {
        ("-", 1): 1.0, ("replicated, JAX_DEFAULT_MATMUL_PRECISION=float32", 2): None}
    # without a one-device run under its flags a row has no efficiency: not one against another program
    assert {(r["parallel"], r["n"]): r["efficiency"] for r in scaling_rows([jax1, jax2_flags])} == {
        ("-", 1): 1.0, ("replicated, XLA_FLAGS=--xla_x=true", 2): None}
    # Inductor's options too, each set against the one-device run given them; where a run
    # caches its compilations changes nothing it times, so it makes no row of its own
    cache = {"TORCHINDUCTOR_CACHE_DIR": "c", "TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "NCCL_VERSION": "2",
             "JAX_COMPILATION_CACHE_DIR": "c"}
    cpp1, cpp2 = _doc("torch-compile", 1, 70.0), _doc("torch-compile", 2, 77.0)
    for doc in (cpp1, cpp2):
        doc["env"] = {"settings": {**cache, "TORCHINDUCTOR_CPP_WRAPPER": "1"}}
    cpp2["data_parallel"]["bucket_mb"] = 250.0
    default["env"] = {"settings": cache}
    got = {(r["parallel"], r["n"]): r["efficiency"] for r in scaling_rows([one, default, cpp1, cpp2])}
    assert got == pytest.approx({("-", 1): 1.0, ("DDP, 250 MB buckets", 2): 80 / 100,
                                 ("TORCHINDUCTOR_CPP_WRAPPER=1", 1): 1.0,
                                 ("DDP, 250 MB buckets, TORCHINDUCTOR_CPP_WRAPPER=1", 2): 70 / 77})


def test_nccl_tuning_is_a_row_of_its_own_against_the_plain_one_device_run() -> None:
    """A data-parallel run given NCCL tuning (NCCL_MAX_CTAS) is its own row, and its baseline
    is the one-device run without it: one device runs no collective. The multicast switch
    every run sets, NCCL's version and its logging are no settings."""
    one, plain, tuned = _doc("torch-compile-cg", 1, 75.0), _doc("torch-compile-cg", 4, 82.0), _doc(
        "torch-compile-cg", 4, 88.0)
    for doc in (plain, tuned):
        doc["data_parallel"]["bucket_mb"] = 250.0
    always = {"NCCL_NVLS_ENABLE": "0", "NCCL_VERSION": "2.28.3-1", "NCCL_DEBUG": "INFO"}
    one["env"] = plain["env"] = {"settings": always}
    tuned["env"] = {"settings": {**always, "NCCL_MAX_CTAS": "8"}}
    got = {(r["parallel"], r["n"]): r["efficiency"] for r in scaling_rows([one, plain, tuned])}
    assert got == pytest.approx({("-", 1): 1.0, ("DDP, 250 MB buckets", 4): 75 / 82,
                                 ("DDP, 250 MB buckets, NCCL_MAX_CTAS=8", 4): 75 / 88})
    # a multicast switch turned back on is a setting
    tuned["env"] = {"settings": {**always, "NCCL_NVLS_ENABLE": "1"}}
    assert ("DDP, 250 MB buckets, NCCL_NVLS_ENABLE=1", 4) in {
        (r["parallel"], r["n"]) for r in scaling_rows([one, plain, tuned])}
    # torch's priority for its NCCL streams is a communication setting as well
    tuned["env"] = {"settings": {**always, "TORCH_NCCL_HIGH_PRIORITY": "1"}}
    assert {(r["parallel"], r["n"]): r["efficiency"] for r in scaling_rows([one, plain, tuned])}[
        ("DDP, 250 MB buckets, TORCH_NCCL_HIGH_PRIORITY=1", 4)] == pytest.approx(75 / 88)


def test_growth_by_phase_by_hand() -> None:
    """Where the step grows: each phase of the slowest rank against the one-device run, with
    the ranks' mean waiting and the all-reduce alone; JAX's fused step has no phases."""
    from harness.reports.scaling import format_growth

    one, two = _doc("torch", 1, 100.0), _doc("torch", 2, 130.0)
    one["phases"].update(forward={"median_ms": 30.0}, backward={"median_ms": 60.0}, optimizer={"median_ms": 9.0})
    two["phases"].update(forward={"median_ms": 31.0}, backward={"median_ms": 80.0}, optimizer={"median_ms": 9.0})
    two["data_parallel"].update(
        spread={"forward": {"max_ms": 40.0}, "backward": {"max_ms": 85.0}, "optimizer": {"max_ms": 9.5}},
        link={"median_ms": 11.0},
        host_split={"ranks": [{"waiting_ms_per_step": 9.0}, {"waiting_ms_per_step": 1.0}]})
    jax1, jax2 = _doc("jax", 1, 60.0), _doc("jax", 2, 70.0)
    for doc, ms in ((jax1, 55.0), (jax2, 66.0)):
        doc["phases"]["fused_step"] = {"median_ms": ms}
    rows = scaling_rows([one, two, jax1, jax2])
    torch2 = next(r for r in rows if r["backend"] == "torch" and r["n"] == 2)
    # the slowest rank's medians where the run has them, the one device's own else
    assert torch2["growth"] == {"step": 30.0, "phases": {"forward": 10.0, "backward": 25.0, "optimizer": 0.5}}
    assert (torch2["waiting_ms"], torch2["link_ms"]) == (5.0, 11.0)
    jax2_row = next(r for r in rows if r["backend"] == "jax" and r["n"] == 2)
    assert jax2_row["phase"] == "fused_step" and jax2_row["growth"] == {"step": 11.0, "phases": {}}
    assert all(r["growth"] is None for r in rows if r["n"] == 1)
    text = format_growth(rows)
    assert "| torch | DDP, 25 MB buckets | 2 | step | +30.0 | +10.0 | +25.0 | +0.5 | 5.0 | 11.0 |" in text
    assert "| jax | replicated | 2 | fused_step | +11.0 | - | - | - | - | - |" in text
    assert format_growth(scaling_rows([one])) == ""
    # FSDP2: an older document's host split is no waiting figure
    two["data_parallel"]["parallel"] = "fsdp"
    two["options"]["parallel"] = "fsdp"
    assert next(r for r in scaling_rows([one, two]) if r["n"] == 2)["waiting_ms"] is None


def test_projection_sets_each_strategy_s_own_run_beside_the_prediction(tmp_path: Path, capsys) -> None:
    """N = 4 runs with and without NCCL tuning are two groups: the plain run (118 ms) stands
    beside the plain fit's prediction (115 ms, `test_projection_by_hand`), the tuned one
    (130 ms, given last) is fitted as a group of its own, not set beside the plain prediction."""
    docs = [_fit_doc(1, 100.0), _fit_doc(2, 110.0), _fit_doc(4, 118.0), _fit_doc(4, 130.0)]
    docs[3]["env"] = {"settings": {"NCCL_MAX_CTAS": "4"}}
    paths = []
    for i, doc in enumerate(docs):
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(json.dumps(doc))
    assert scaling.main([*map(str, paths), "--project", "4"]) == 0
    out = capsys.readouterr().out
    plain = out[out.index("Projection for torch (DDP, 25 MB buckets):"):out.index("Projection for torch (DDP, 25 MB "
                                                                                   "buckets, NCCL_MAX_CTAS=4)")]
    assert "| 4 | 1 | 30.000 | 15.000 | 115.000 | 87.0% | 118.000 | 84.7% |" in plain and "130.000 |" not in plain
    # the tuned group is fitted at its own N = 4 (130 ms: 30 ms over compute, the all-reduce's 30 ms, none hidden)
    tuned = out[out.index("NCCL_MAX_CTAS=4): compute"):]
    assert "fitted at N = 4 (130.000 ms): 0.0% of the all-reduce hidden" in tuned
    # a group without a one-device run under its compiler settings cannot be fitted
    docs[3]["env"] = {"settings": {"XLA_FLAGS": "--xla_x=true"}}
    paths[3].write_text(json.dumps(docs[3]))
    assert scaling.main([*map(str, paths), "--project", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "give an N = 1 run of that backend and shape under the same compiler settings" in err[0]
