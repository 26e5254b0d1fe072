"""Communication/computation overlap on hand-made kernel tables, counted by hand."""

from __future__ import annotations

import numpy as np
import pytest

from harness.trace.analyses.intervals import covered_measure, union
from harness.trace.analyses.overlap import (
    format_overlap,
    overlap,
    per_step_exposure,
    per_step_lines,
    rank_analysis,
    rank_of,
)
from harness.trace.kernels import Category, classify
from harness.trace.profile import Kernel, KernelTable, Profile, ProfileError, Range

NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
EW = "vectorized_elementwise_kernel"
COMPUTE, COMM = 7, 13  # streams


@pytest.mark.parametrize("name", [NCCL, "ncclKernel_AllGather_RING_LL_Sum_int8_t", "all-reduce-start",
                                  "reduce-scatter.3", "loop_all_gather_fusion", "OneShotAllReduceKernel"])
def test_collectives_are_communication(name: str) -> None:
    assert classify(name) is Category.COMMUNICATION


@pytest.mark.parametrize("name", ["input_reduce_fusion", "small_reduce_kernel", "reduce_kernel<512>"])
def test_reductions_stay_reductions(name: str) -> None:
    assert classify(name) is Category.REDUCTION


def test_union_merges_overlapping_intervals() -> None:
    s, e = union(np.array([10, 0, 3, 20, 25]), np.array([12, 5, 4, 30, 26]))
    assert s.tolist() == [0, 10, 20] and e.tolist() == [5, 12, 30]


def test_covered_measure_by_hand() -> None:
    a = union(np.array([0, 10, 40]), np.array([8, 20, 50]))
    b = union(np.array([5, 15, 45, 60]), np.array([12, 18, 47, 70]))
    # [0,8)&[5,12) = 3, [10,20)&([5,12) + [15,18)) = 2 + 3, [40,50)&[45,47) = 2, [60,70): no a
    assert covered_measure(a, b) == 10
    assert covered_measure(b, a) == 10
    assert covered_measure(a, union(np.array([]), np.array([]))) == 0


def _table() -> KernelTable:
    k = [
        # device 0: compute [0,10) [12,20); NCCL [5,15) on its own stream: hidden 5 + 3, exposed 2
        Kernel(GEMM, 0, 10, 0, COMPUTE), Kernel(EW, 12, 20, 0, COMPUTE), Kernel(NCCL, 5, 15, 0, COMM),
        # a collective on the compute stream itself ([40,50) beside compute [40,50) of the same
        # stream, which a real trace never shows): nothing to hide under, all exposed
        Kernel(NCCL, 40, 50, 0, COMPUTE), Kernel(EW, 40, 50, 0, COMPUTE),
        # a memcpy overlapping the NCCL kernel is not compute
        Kernel("[CUDA memcpy]", 14, 15, 0, 20),
        # device 1: NCCL [0,4) and [2,6) (one stream: union [0,6)), compute [1,3) on two
        # streams and [5,9): hidden [1,3) + [5,6) = 3 of 6
        Kernel(NCCL, 0, 4, 1, COMM), Kernel(NCCL, 2, 6, 1, COMM), Kernel(GEMM, 1, 3, 1, COMPUTE),
        Kernel(GEMM, 1, 2, 1, 8), Kernel(EW, 5, 9, 1, COMPUTE),
        # device 2: no communication at all
        Kernel(GEMM, 0, 5, 2, COMPUTE),
    ]
    return KernelTable.from_kernels([Kernel(x.name, x.start * 1_000_000, x.end * 1_000_000, x.device, x.stream)
                                     for x in k])


def test_overlap_by_hand() -> None:
    by_device = {d["device"]: d for d in overlap(_table())}
    assert by_device[0]["communication_ms"] == 20  # [5,15) on COMM + [40,50) on COMPUTE
    assert by_device[0]["hidden_ms"] == 8
    assert by_device[0]["exposed_ms"] == 12
    assert by_device[1]["communication_ms"] == 6 and by_device[1]["hidden_ms"] == 3
    assert by_device[1]["hidden_share"] == 0.5
    assert by_device[2] == {"device": 2, "communication_ms": 0, "hidden_ms": 0, "exposed_ms": 0,
                            "hidden_share": None}


def test_only_measured_steps_count() -> None:
    ms = 1_000_000
    # one measured step [0,16): device 0's NCCL [5,15) and compute in it; [40,50) is outside
    ranges = [Range("warmup", -100 * ms, -1), Range("step", 0, 16 * ms)]
    d0 = next(d for d in overlap(_table(), ranges) if d["device"] == 0)
    assert (d0["communication_ms"], d0["hidden_ms"]) == (10, 5)  # [12,20) ends after the step: left out


def _rank_profile(step_ms: list[int], nccl_ms: int) -> Profile:
    """Steps of the given lengths; a 10 ms GEMM from 0 and NCCL from 8 ms on another stream."""
    ms = 1_000_000
    ranges, t = [], 0
    for s in step_ms:
        ranges += [Range("step", t, t + s * ms), Range("forward", t, t + ms)]
        t += s * ms + ms
    kernels = [Kernel(GEMM, 0, 10 * ms, 0, COMPUTE), Kernel(NCCL, 8 * ms, (8 + nccl_ms) * ms, 0, COMM)]
    return Profile("p", "rank", "nsys", kernels, ranges)


def test_rank_analysis_spread_and_totals() -> None:
    a = rank_analysis({1: _rank_profile([12, 14, 30], 4), 0: _rank_profile([11, 12, 13], 2)})
    assert [r["rank"] for r in a["ranks"]] == [0, 1]
    assert a["ranks"][1]["phases_ms"]["step"] == 14  # the median
    assert a["spread"]["step"]["straggler"] == pytest.approx(14 / 12)
    # rank 0: 2 ms of NCCL all under the GEMM; rank 1: 4 ms, 2 hidden
    assert (a["communication_ms"], a["hidden_ms"], a["exposed_ms"]) == (6, 4, 2)
    text = format_overlap(a)
    lines = text.splitlines()
    assert "2.000 ms exposed (33.3%)" in lines[-1] and len(lines[:3]) == 3 and "transfer ms" in lines[3]


def test_rank_of_per_rank_names() -> None:
    assert rank_of("out/torch.rank3.nsys-rep") == 3
    assert rank_of("trace.rank0.json") == 0
    with pytest.raises(ProfileError, match=r"name\.rank<N>\.<ext>"):
        rank_of("torch.nsys-rep")


def test_compare_report_shows_the_overlap() -> None:
    from harness.reports.compare import data_parallel_lines

    analysis = rank_analysis({0: _rank_profile([11, 12, 13], 2), 1: _rank_profile([12, 14, 30], 4)})
    dp = {"n": 2, "parallel": "ddp", "global_batch": 8, "step_ms": 14.0, "tokens_per_s": 1000.0, "note": "",
          "ranks": [{"rank": 0}, {"rank": 1}],
          "spread": {"step": {"min_ms": 12.0, "max_ms": 14.0, "straggler": 14 / 12, "slowest_rank": 1}}}
    summary = {"runs": {"torch": {"status": "ok", "data_parallel": dp}}, "overlap": {"torch": analysis}}
    text = "\n".join(data_parallel_lines(summary))
    assert "global batch 8: step 14.000 ms" in text and "straggler 1.167x (slowest rank 1)" in text
    # rank 1: 4 ms of NCCL from 8 ms, the GEMM ends at 10: 2 hidden, 2 exposed; rank 0 all hidden
    assert "| torch | 1 | 0 | 4.000 | 2.000 | 2.000 | 50.0% |" in text
    assert "| torch | 0 | 0 | 2.000 | 2.000 | 0.000 | 100.0% |" in text
    assert "| **torch, all** |  |  | 6.000 | 4.000 | 2.000 | 66.7% |" in text
    assert "Exposed share of the communication: torch 33.3%." in text
    # per step: rank 0 none of its 2 ms exposed, rank 1 2 of its 4 ms, over 3 steps each; medians 12 and 14 ms
    # all of it in the first step (the profile's kernels lie in it): the median step exposes none
    assert "| torch | step | 2 | 1.000 | 0.333 | 0.667 | 0.000 | 13.000 | 2.6% |" in text
    assert "measured step 0 exposed 2.000 ms on rank 1 (device 0)" in text
    # a folder made before the per-step figures: derived from the totals and --steps
    for r in analysis["ranks"]:
        for d in r["overlap"]:
            del d["per_step"]
    del analysis["per_step"]
    assert "| torch | step | 2 | 1.000 | 0.333 | 0.667 | - | 13.000 | 2.6% |" in "\n".join(
        data_parallel_lines({**summary, "options": {"steps": 3}}))
    assert "torch: no per-step figures; this folder was made before they were kept" in "\n".join(
        data_parallel_lines(summary))
    assert data_parallel_lines({"runs": {"torch": {"status": "ok"}}}) == []


def test_per_step_kinds_kept_apart_by_hand() -> None:
    """Two split steps whose collective runs alone (all exposed) and two fused steps whose
    collective runs under compute (all hidden): per kind, not one mixed share."""
    ms = 1_000_000
    kernels, ranges = [], []
    for i in range(2):  # split steps of 20 ms: compute [0,10), then a 4 ms all-reduce alone
        t = i * 100
        ranges.append(Range("step", t * ms, (t + 20) * ms))
        kernels += [Kernel(GEMM, t, t + 10, 0, COMPUTE), Kernel(NCCL, t + 12, t + 16, 0, COMM)]
    for i in range(2):  # fused steps of 10 and 12 ms: a 4 ms all-reduce under a 9 ms GEMM
        t = 200 + i * 100
        ranges.append(Range("fused_step", t * ms, (t + 10 + 2 * i) * ms))
        kernels += [Kernel(GEMM, t, t + 9, 0, COMPUTE), Kernel(NCCL, t + 2, t + 6, 0, COMM)]
    kt = KernelTable.from_kernels([Kernel(k.name, k.start * ms, k.end * ms, k.device, k.stream) for k in kernels])
    (d,) = overlap(kt, ranges)
    assert (d["communication_ms"], d["exposed_ms"]) == (16, 8)  # the mixed figure: half exposed
    assert d["per_step"] == {
        "step": {"steps": 2, "step_ms": 20, "communication_ms": 4, "exposed_ms": 4, "exposed_each_ms": [4, 4]},
        "fused_step": {"steps": 2, "step_ms": 11, "communication_ms": 4, "exposed_ms": 0, "exposed_each_ms": [0, 0]}}
    analysis = rank_analysis({0: Profile("p", "jax", "nsys", [], ranges)})  # no kernels: nothing per step
    assert "per_step" not in analysis
    per = per_step_exposure({"ranks": [{"rank": 0, "overlap": [d], "phases_ms": {}}]})
    assert per["step"]["exposed_share_of_step"] == pytest.approx(4 / 20)
    assert per["fused_step"]["exposed_share_of_step"] == 0
    text = "\n".join(per_step_lines(per))
    assert "per step: 4.000 ms of communication, 4.000 ms exposed (mean over 1 device, at most 4.000) in a " \
           "20.000 ms step: 20.0% of the step" in text


def test_per_step_of_an_analysis_made_before_it() -> None:
    """An older analysis (no `per_step`): torch's one kind of step is derived from the totals
    and the measured steps; JAX's split and fused steps summed together give nothing."""
    a = rank_analysis({0: _rank_profile([11, 12, 13], 2), 1: _rank_profile([12, 14, 30], 4)})
    assert a["per_step"]["step"]["devices"] == 2
    for r in a["ranks"]:
        for d in r["overlap"]:
            del d["per_step"]
    # rank 0: 2 ms of communication, none exposed; rank 1: 4 ms, 2 exposed; over 3 steps each
    old = per_step_exposure(a, steps=3)["step"]
    assert old["communication_ms"] == pytest.approx((2 + 4) / 2 / 3)
    assert old["exposed_ms"] == pytest.approx(1 / 3) and old["exposed_max_ms"] == pytest.approx(2 / 3)
    assert old["step_ms"] == 13  # the median of the ranks' medians 12 and 14
    assert per_step_exposure(a) == {}  # without the number of steps
    a["ranks"][0]["phases_ms"]["fused_step"] = 10.0
    assert per_step_exposure(a, steps=3) == {}


def test_one_late_step_is_told_from_the_steady_state() -> None:
    """Five 20 ms steps on two ranks, each a 4 ms all-reduce from 4 ms under a 10 ms GEMM;
    in the first, rank 0's all-reduce waits 12 ms more for a rank that began late. Counted by
    hand: rank 0's step 0 exposes 10 ms ([10,20) of its all-reduce [4,20)), every other step
    of either rank none. Communication per step: rank 0 (16 + 4 x 4) / 5 = 6.4 ms, rank 1
    4 ms; exposed: rank 0 10 / 5 = 2 ms, rank 1 0. The mean step, 1 ms over both ranks, is
    driven by one step (the median step exposes none): named, with the step."""
    from harness.reports.compare import per_step_table

    ms = 1_000_000

    def rank(late: bool) -> Profile:
        kernels, ranges = [], []
        for i in range(5):
            t = i * 30
            ranges.append(Range("step", t * ms, (t + 20) * ms))
            start, end = (4, 20) if late and i == 0 else (4, 8)
            kernels += [Kernel(GEMM, t * ms, (t + 10) * ms, 0, COMPUTE),
                        Kernel(NCCL, (t + start) * ms, (t + end) * ms, 0, COMM)]
        return Profile("p", "torch", "nsys", kernels, ranges)

    a = rank_analysis({0: rank(True), 1: rank(False)})
    p = a["per_step"]["step"]
    assert a["ranks"][0]["overlap"][0]["per_step"]["step"]["exposed_each_ms"] == [10, 0, 0, 0, 0]
    assert p["exposed_ms"] == pytest.approx((10 / 5 + 0) / 2)  # the mean step, averaged over the ranks
    assert p["exposed_median_ms"] == 0 and p["worst_step"] == {"exposed_ms": 10, "index": 0, "rank": 0, "device": 0}
    text = "\n".join(per_step_table({"overlap": {"torch": a}}))
    assert "| torch | step | 2 | 5.200 | 1.000 | 2.000 | 0.000 | 20.000 | 5.0% |" in text
    assert ("- torch: the mean step is driven by a few: measured step 0 exposed 10.000 ms on rank 0 (device 0), "
            "the median one 0.000 ms") in text
    steady = rank_analysis({0: rank(False), 1: rank(False)})
    assert "driven" not in "\n".join(per_step_table({"overlap": {"torch": steady}}))
