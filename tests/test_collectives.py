"""Transfer and waiting of collectives aligned across ranks, counted by hand on kernel
tables with NCCL's and XLA's real kernel names, and a planted straggler on two gloo ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.trace.analyses.collectives import align, bus_factor, kernel_ops, kind_of
from harness.trace.profile import Kernel, KernelTable, Profile, Range

ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"


@pytest.mark.parametrize(("name", "kind"), [
    (ALL_REDUCE, "all-reduce"), ("ncclKernel_AllGather_RING_LL_Sum_int8_t", "all-gather"),
    ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", "reduce-scatter"), ("all-reduce-start", "all-reduce"),
    ("reduce-scatter.3", "reduce-scatter"), ("loop_all_gather_fusion", "all-gather")])
def test_kinds_from_real_kernel_names(name: str, kind: str) -> None:
    assert kind_of(name) == kind


def test_bus_factors_are_nccls() -> None:
    assert (bus_factor("all-reduce", 4), bus_factor("all-gather", 4), bus_factor("reduce-scatter", 2)) == (1.5, 0.75,
                                                                                                         0.5)


# One step [0, 1000) on each rank; rank 1's forward is 150 ns longer, so it reaches both
# all-reduces of its backward last.
RANGES = {0: [Range("step", 0, 1000), Range("forward", 0, 300), Range("backward", 300, 900),
              Range("optimizer", 900, 1000)],
          1: [Range("step", 0, 1000), Range("forward", 0, 450), Range("backward", 450, 950),
              Range("optimizer", 950, 1000)]}
COLLECTIVES = {0: [(400, 600), (700, 850)], 1: [(500, 600), (720, 860)]}


def _table(device_of_rank: dict[int, int]) -> KernelTable:
    kernels = [Kernel(GEMM, 10, 290, device_of_rank[r], 7) for r in COLLECTIVES]
    kernels += [Kernel(ALL_REDUCE, s, e, device_of_rank[r], 13) for r, spans in COLLECTIVES.items() for s, e in spans]
    return KernelTable.from_kernels(kernels)


def _check(split: dict) -> None:
    ranks = {r["rank"]: r for r in split["ranks"]}
    # all-reduce 1: rank 1 arrives at 500; rank 0 (from 400, 200 ns) waits 100, transfers 100.
    # all-reduce 2: rank 1 arrives at 720; rank 0 (from 700, 150 ns) waits 20, transfers 130.
    assert ranks[0]["waiting_ms"] == pytest.approx(120e-6) and ranks[0]["transfer_ms"] == pytest.approx(230e-6)
    assert ranks[1]["waiting_ms"] == 0 and ranks[1]["transfer_ms"] == pytest.approx(240e-6)
    for r in ranks.values():
        assert r["waiting_ms"] + r["transfer_ms"] == pytest.approx(r["communication_ms"])
    assert (split["last_rank"], split["last_share"], split["collectives"]) == (1, 1.0, 2)
    # rank 1 had spent 450 ns in its forward at both arrivals, rank 0 300: 150 ns late from the forward
    assert split["late_phase"] == "forward" and split["late_ms"] == pytest.approx(150e-6)
    (kind,) = split["kinds"]
    # 1000 bytes per step over a transfer of (230 + 240) / 2 ns: 4.255 GB/s; x 2(N-1)/N = 1 at N = 2
    assert kind["kind"] == "all-reduce" and kind["algbw_gbps"] == pytest.approx(1000 / 235)
    assert kind["busbw_gbps"] == pytest.approx(kind["algbw_gbps"])


def test_torch_ranks_each_with_its_profile() -> None:
    ops = {r: kernel_ops(_table({0: 0, 1: 0}), RANGES[r]) for r in RANGES}
    # each rank's own profile holds only its kernels: keep rank r's by their start times
    ops = {r: [op for op in ops[r] if (op.start, op.end) in COLLECTIVES[r]] for r in ops}
    _check(align(ops, RANGES, {"all-reduce": 1000}))


def test_jax_devices_of_one_process() -> None:
    table = _table({0: 0, 1: 1})
    ops = {d: kernel_ops(table, RANGES[0] + RANGES[1], device=d) for d in (0, 1)}
    _check(align(ops, RANGES, {"all-reduce": 1000}))


def test_planted_straggler_shows_as_waiting_on_the_other_rank(tmp_path) -> None:
    """Rank 1 sleeps 1 s at the start of every forward (the test-only fault hook): rank 0
    reaches the backward's all-reduce first and waits there for it, each step about the
    sleep; rank 1, always last, barely waits; its forward is what made it late. The sleep
    is long against a tiny step's CPU time (tens of ms, up to a few hundred on a busy
    machine), so the bounds hold on a loaded CPU; forward-backward mode skips the
    overhead check's extra steps. Two warm-up steps: DDP rebuilds its buckets in the
    second step's forward, a collective there that would make rank 0 wait in its forward."""
    import json
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "dp.json"
    env = {**os.environ, "PYTHONPATH": str(root), "XFPROF_DP_SLOW_RANK": "1:1.0"}
    proc = subprocess.run([sys.executable, "-m", "harness.run", "--backend", "torch", "--model", "tiny", "--ctx", "16",
                           "--batch", "2", "--warmup", "2", "--steps", "3", "--mode", "forward-backward", "--device", "cpu",
                           "--data-parallel", "2",
                           "--quiet", "--out", str(out)], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    dp = json.loads(out.read_text())["data_parallel"]
    split = dp["host_split"]
    ranks = {r["rank"]: r for r in split["ranks"]}
    assert (split["last_rank"], split["last_share"], split["late_phase"]) == (1, 1.0, "forward")
    assert 700 < ranks[0]["waiting_ms_per_step"] < 1300  # the 1000 ms sleep, give or take the step's CPU time
    assert ranks[0]["transfer_ms_per_step"] < 0.5 * ranks[0]["waiting_ms_per_step"]
    assert ranks[1]["waiting_ms_per_step"] < 0.2 * ranks[0]["waiting_ms_per_step"]
    assert dp["link"]["bytes"] > 0 and len(dp["link"]["times_ms"]) == 5
    assert "last to arrive: rank 1 in 100% of steps, late from its forward" in proc.stdout


def test_a_rank_late_to_a_timed_round_is_not_counted_by_the_others(tmp_path) -> None:
    """The overhead check's rounds of back-to-back steps start with the ranks aligned.
    Rank 1 sleeps 1 s before each of them (the fault hook's `round`: 4 rounds of two loops,
    8 s in all). Had rank 0 started its round without it, its first step would wait for
    rank 1 in the all-reduce, 1 s over 3 steps: 333 ms a step on a step of tens of ms."""
    import json
    import os
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "dp.json"
    env = {**os.environ, "PYTHONPATH": str(root), "XFPROF_DP_SLOW_RANK": "1:1.0:round"}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "harness.run", "--backend", "torch", "--model", "tiny", "--ctx", "16",
                           "--batch", "2", "--warmup", "1", "--steps", "3", "--device", "cpu", "--data-parallel", "2",
                           "--quiet", "--out", str(out)], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert elapsed > 8.0  # the planted sleeps happened
    ranks = json.loads(out.read_text())["ranks"]
    assert [r["overhead"]["steps_per_round"] for r in ranks] == [3, 3]
    # Counted, rank 1's second would add 333 ms to each of rank 0's plain steps and nothing
    # to rank 1's own. The ranks run in step through every all-reduce, so their figures
    # agree far closer than that, however slow the machine makes both.
    plain = [r["overhead"]["plain_step_ms"] for r in ranks]
    assert abs(plain[0] - plain[1]) < 1000 / 3 / 2, plain


# Real profiles of a 2-GPU run (tests/data/dp_small_bf16/README.md): torch DDP, one nsys
# report per rank, and JAX's one process over two devices; `small`, ctx 128, bf16, the
# first two measured steps of each.
DP = Path(__file__).parent / "data" / "dp_small_bf16"


@pytest.fixture(scope="module")
def torch_ranks() -> dict:
    from harness.trace.analyses.breakdown import load_profile

    return {r: load_profile(DP / f"torch_dp2.rank{r}.sqlite.gz", f"rank{r}") for r in (0, 1)}


def test_real_torch_ranks_waiting_plus_transfer_is_communication(torch_ranks: dict) -> None:
    from harness.trace.analyses.collectives import profile_split

    split = profile_split(torch_ranks)
    for r in split["ranks"]:
        assert r["waiting_ms"] + r["transfer_ms"] == pytest.approx(r["communication_ms"], rel=1e-12)
    # every NCCL kernel of the measured steps on both ranks is one aligned all-reduce
    counts = {r: len(kernel_ops(p.kernels, p.ranges)) for r, p in torch_ranks.items()}
    assert counts[0] == counts[1] == split["collectives"] > 0
    # the transfer itself is the same operation on both ranks: within 10% of each other
    t0, t1 = (r["transfer_ms"] for r in split["ranks"])
    assert abs(t0 - t1) < 0.1 * max(t0, t1)


def test_real_torch_arrival_order_agrees_with_the_nvtx_ranges(torch_ranks: dict) -> None:
    """The last rank to reach the all-reduces is, step by step, the one whose `backward`
    range (where DDP issues them) starts later on the host clock the reports share."""
    from harness.trace.analyses.collectives import profile_split

    base = min(p.session_start_ns for p in torch_ranks.values())
    later = []
    for step in range(2):
        starts = {r: [x.start for x in p.ranges if x.name == "backward"][step] + p.session_start_ns - base
                  for r, p in torch_ranks.items()}
        later.append(max(starts, key=starts.__getitem__))
    split = profile_split(torch_ranks)
    assert later == [split["last_rank"]] * 2
    waits = {r["rank"]: r["waiting_ms"] for r in split["ranks"]}
    assert waits[1 - split["last_rank"]] > waits[split["last_rank"]]  # the early rank does the waiting


def test_real_jax_devices_of_one_process() -> None:
    from harness.trace.analyses.breakdown import breakdown, load_profile
    from harness.trace.analyses.collectives import profile_split

    profile = load_profile(DP / "jax_dp2.sqlite.gz", "jax")
    split = profile_split({0: profile})
    assert [r["rank"] for r in split["ranks"]] == [0, 1]  # the two devices
    for r in split["ranks"]:
        assert r["waiting_ms"] + r["transfer_ms"] == pytest.approx(r["communication_ms"], rel=1e-12)
    counts = [len(kernel_ops(profile.kernels, profile.ranges, device=d)) for d in (0, 1)]
    assert counts[0] == counts[1] == split["collectives"] > 0
    # per-device figures: each phase's kernel time is the mean of the two devices' own
    bd = breakdown(profile)
    for name, phase in bd.phases.items():
        assert phase.devices == 2, name
        assert phase.busy_ns_per_step <= phase.gpu_ns_per_step * (1 + 1e-12) <= phase.range_ns_per_step, name


def _rank_profile(rank: int, kernels: list[Kernel]) -> Profile:
    # a warm-up step first, its forward all kernels (left out of the share), then the measured step
    warm = [Range("warmup", -2000, -1000), Range("step", -2000, -1000), Range("forward", -2000, -1500)]
    kernels = [Kernel(GEMM, -2000, -1500, 0, 7), *kernels]
    return Profile(path=f"r{rank}", label=f"rank{rank}", source="nsys", kernels=kernels, ranges=warm + RANGES[rank],
                   session_start_ns=0)


def test_the_late_ranks_phase_says_whether_its_host_set_the_pace() -> None:
    """Rank 1 is late from its forward [0, 450): its kernels (0-100, 50-150, 300-350) cover
    150 + 50 = 200 ns of it, 44% (the warm-up's fully covered forward is left out): below
    half, so the report calls it launch-bound. Rank 0's forward [0, 300) is covered 10-290."""
    from harness.trace.analyses.collectives import format_split, phase_busy, profile_split

    coll = lambda r: [Kernel(ALL_REDUCE, s, e, 0, 13) for s, e in COLLECTIVES[r]]  # noqa: E731
    profiles = {0: _rank_profile(0, [Kernel(GEMM, 10, 290, 0, 7), *coll(0)]),
                1: _rank_profile(1, [Kernel(GEMM, 0, 100, 0, 7), Kernel(GEMM, 50, 150, 0, 9),
                                     Kernel(GEMM, 300, 350, 0, 7), *coll(1)])}
    assert phase_busy(profiles[0], "forward") == pytest.approx(280 / 300)
    split = profile_split(profiles)
    assert (split["last_rank"], split["late_phase"]) == (1, "forward")
    assert split["late_busy"] == pytest.approx(200 / 450)
    text = "\n".join(format_split(split))
    assert "its GPU ran kernels 44% of that phase's time: the host issuing the kernels (launch-bound)" in text
    # the same rank with its forward busy 90% of the time: named, not called launch-bound
    profiles[1] = _rank_profile(1, [Kernel(GEMM, 0, 405, 0, 7), *coll(1)])
    split = profile_split(profiles)
    assert split["late_busy"] == pytest.approx(0.9)
    text = "\n".join(format_split(split))
    assert "its GPU ran kernels 90% of that phase's time" in text and "launch-bound" not in text


def test_real_torch_phase_busy_share_by_brute_force(torch_ranks: dict) -> None:
    """Each rank's GPU-busy share of its forward and backward equals a plain merge of its
    kernels' intervals clipped to each measured range of the phase."""
    from harness.trace.analyses.collectives import phase_busy

    for profile in torch_ranks.values():
        for phase in ("forward", "backward"):
            warm = [r for r in profile.ranges if r.name == "warmup"]
            spans = [r for r in profile.ranges if r.name == phase
                     and not any(w.start <= r.start and r.end <= w.end for w in warm)]
            busy = total = 0
            for span in spans:
                total += span.end - span.start
                clipped = sorted((max(s, span.start), min(e, span.end))
                                 for s, e in zip(profile.kernels.start.tolist(), profile.kernels.end.tolist())
                                 if s < span.end and e > span.start)
                end = span.start
                for s, e in clipped:
                    busy += max(0, e - max(s, end))
                    end = max(end, e)
            assert total > 0
            assert phase_busy(profile, phase) == pytest.approx(busy / total, rel=1e-12)
            assert 0 < phase_busy(profile, phase) <= 1


def test_host_split_only_where_the_backward_holds_the_collectives() -> None:
    """DDP's all-reduce sits in the backward, so a rank whose backward starts late made
    the other wait there; FSDP2's all-gathers run inside the forward too, where host
    timings cannot tell waiting from computing: no split, and the run says why."""
    from harness.reports.run import format_data_parallel
    from harness.runs.distributed import host_split

    ms = 1_000_000
    def rank(r, forward_ms):  # noqa: E306
        f_end = forward_ms * ms
        return {"rank": r, "intervals_ns": {"step": [[0, 40 * ms]], "forward": [[0, f_end]],
                                             "backward": [[f_end, 30 * ms]], "optimizer": [[30 * ms, 40 * ms]]}}
    doc = {"options": {"parallel": "ddp"}, "ranks": [rank(0, 10), rank(1, 15)]}
    split = host_split(doc)
    assert split["last_rank"] == 1 and split["late_phase"] == "forward"
    assert [round(r["waiting_ms"], 6) for r in split["ranks"]] == [5.0, 0.0]
    doc["options"]["parallel"] = "fsdp"
    assert host_split(doc) is None
    medians = {"forward": 15.0, "backward": 15.0, "optimizer": 10.0, "step": 40.0}
    dp = {"n": 2, "parallel": "fsdp", "label": "FSDP2", "global_batch": 4, "step_ms": 40.0, "tokens_per_s": 1.0,
          "ranks": [{"rank": r, "median_ms": medians} for r in (0, 1)], "note": "",
          "spread": {"step": {"min_ms": 40.0, "max_ms": 40.0, "slowest_rank": 0, "straggler": 1.0}},
          "host_split": split}  # as a document written before FSDP2 runs went unsplit carries
    lines = format_data_parallel({"options": {"backend": "torch"}, "data_parallel": dp})
    assert any("FSDP2's collectives run inside the forward" in line for line in lines)
    assert not any("waiting per step" in line for line in lines)


def test_bytes_each_collective_kind_moves_per_step() -> None:
    """4 bytes per float32 parameter: DDP all-reduces the gradients once; FSDP2
    reduce-scatters them and all-gathers the parameters in the forward and, resharded, again
    in the backward; JAX's sharded run only has its gradients' size known."""
    from harness.trace.analyses.collectives import collective_bytes

    def doc(parallel: str, reshard: bool = True) -> dict:
        return {"num_params": 1000, "options": {"parallel": parallel, "fsdp_reshard_after_forward": reshard}}
    assert collective_bytes(doc("ddp"), fsdp2=True) == {"all-reduce": 4000}
    assert collective_bytes(doc("fsdp"), fsdp2=True) == {"reduce-scatter": 4000, "all-gather": 8000}
    assert collective_bytes(doc("fsdp", reshard=False), fsdp2=True) == {"reduce-scatter": 4000, "all-gather": 4000}
    assert collective_bytes(doc("fsdp")) == {"reduce-scatter": 4000}  # JAX's sharded parameters
    assert collective_bytes(doc("zero1")) == {"all-reduce": 4000}
    assert collective_bytes(None) == {}
    # torch's bf16 compression hook halves the gradients' bytes; XLA sums JAX's bf16 matmul
    # gradients in bf16 beside float32 ones, so no one size fits its bf16 runs
    torch_bf16 = {"num_params": 1000, "options": {"backend": "torch-compile", "parallel": "ddp", "grad_comm": "bf16"}}
    assert collective_bytes(torch_bf16) == {"all-reduce": 2000}
    jax = {"num_params": 1000, "options": {"backend": "jax", "parallel": "fsdp", "dtype": "bf16"}}
    assert collective_bytes(jax, bf16_sums=True) == {}
    assert collective_bytes({**jax, "options": {**jax["options"], "dtype": "fp32"}}, bf16_sums=True) == {
        "reduce-scatter": 4000}


def test_the_report_gives_bandwidth_only_for_bytes_it_knows() -> None:
    """On the committed four-H200 compare: torch's all-reduce bus bandwidth is its float32
    gradients' bytes over the transfer time, times 2 (N - 1) / N, and under the link's own
    measurement; JAX's bf16 run, whose collectives mix bf16 and float32 (its kernels' names),
    gets none, where a float32 size put it above the link."""
    import json
    from pathlib import Path

    from harness.reports.compare import split_lines

    folder = Path(__file__).resolve().parent.parent / "results/several-gpus/exposed-n4-h200/ddp4"
    summary = json.loads((folder / "summary.json").read_text())
    text = "\n".join(split_lines(summary))
    torch_part, jax_part = text.split("### jax: transfer and waiting")
    run, split = summary["runs"]["torch-compile-cg"], summary["overlap"]["torch-compile-cg"]["split"]
    (kind,) = split["kinds"]
    bus = 4 * run["num_params"] / (kind["transfer_ms_per_step"] * 1e6) * 2 * 3 / 4
    link = run["data_parallel"]["link"]["busbw_gbps"]
    assert f"bus {bus:.1f} GB/s (the link measured {link:.1f} GB/s bus)" in torch_part and bus < link
    assert "GB/s" not in jax_part and "all-reduce: " in jax_part
    kernels = (folder / "kernels.md").read_text()
    assert "ncclDevKernel_AllReduce_Sum_bf16" in kernels and "ncclDevKernel_AllReduce_Sum_f32" in kernels


@pytest.mark.parametrize("name", ["jax_dp2.sqlite.gz", "torch_dp2.rank0.sqlite.gz"])
def test_real_per_step_figures_add_up_to_the_totals(name: str) -> None:
    """On the real 2-GPU profiles (sliced to two split steps: the fused steps are kept apart
    from them in tests/test_overlap.py) the per-step figures times the steps give the
    totals back, per device of JAX's one process and per torch rank."""
    from harness.trace.analyses.breakdown import load_profile
    from harness.trace.analyses.overlap import overlap

    profile = load_profile(DP / name, "p")
    kinds = {r.name for r in profile.ranges if r.name in ("step", "fused_step")}
    assert kinds == {"step"}
    for d in overlap(profile.kernels, profile.ranges):
        per = d["per_step"]
        assert set(per) == kinds
        for key in ("communication_ms", "exposed_ms"):
            assert sum(p[key] * p["steps"] for p in per.values()) == pytest.approx(d[key], rel=1e-9)
        assert all(0 <= p["exposed_ms"] <= p["communication_ms"] < p["step_ms"] for p in per.values())
        # each step's exposed time, in order, sums to the mean step's times the steps
        assert all(len(p["exposed_each_ms"]) == p["steps"] and sum(p["exposed_each_ms"]) ==
                   pytest.approx(p["exposed_ms"] * p["steps"], rel=1e-9) for p in per.values())
