"""HTA's analyses matched on HTA's own test traces: the figures HolisticTraceAnalysis
computed (tests/data/hta/hta_figures.json, written by hta_figures.py beside it, with the
HTA version named there) against ours in HTA's scope. HTA is not imported here."""

from __future__ import annotations

import gzip
import json
import math
from decimal import Decimal
from pathlib import Path

import pytest

from harness.trace.analyses.breakdown import load_profile
from harness.trace.analyses.gpu_time import gpu_time

HTA = Path(__file__).parent / "data" / "hta"
REF = json.loads((HTA / "hta_figures.json").read_text())
CASES = [("sampled", "sampled_rank-0.json.gz"), ("sampled", "sampled_rank-1.json.gz"),
         ("negative_queue", "negative_queue_rank0.json.gz"), ("ns_resolution", "ns_resolution_rank0.json.gz"),
         # ROCm: hipLaunchKernel & co. in the queue length; no launch statistics in HTA 0.5.0
         ("mi250", "mi250_rocm.json.gz"),
         # cuda_sync records on a stream counted as GPU activities (Stream Sync; Stream Wait Event
         # as compute; Context Sync on "stream" 4294967295), no or one ProfilerStep: nothing filtered
         ("event_sync", "event_sync.json.gz"), ("event_sync_multi_stream", "event_sync_multi_stream.json.gz"),
         ("alexnet", "alexnet.json.gz"),
         # rank 1 alone; two ProfilerSteps, then one: 16 activities launched before the trace kept
         ("trace_compare_base", "trace_compare_base.json.gz"), ("one_step", "trace_compare_base_one_step.json.gz")]


@pytest.fixture(scope="module")
def ours() -> dict:
    return {f: gpu_time(load_profile(HTA / f), "hta") for _, f in CASES}


def _ref(name: str, f: str, what: str) -> dict:
    rank = load_profile(HTA / f).rank
    (only,) = REF["sets"][name]["ranks"] if rank is None else (rank,)  # HTA numbers a trace without one 0
    return REF["sets"][name][what].get(str(only), {})


def test_the_stored_figures_name_their_hta_version() -> None:
    assert REF["hta_version"] == "0.5.0"


@pytest.mark.parametrize("name,f", CASES)
def test_temporal_breakdown_equals_hta(ours: dict, name: str, f: str) -> None:
    ref = _ref(name, f, "temporal")
    assert ours[f]["activities"] == _ref(name, f, "kernels")["events"]
    t = ours[f]["temporal"]  # HTA's are whole µs, ours too in its scope: exact equality
    assert (t["kernel_time_us"], t["idle_time_us"], t["compute_time_us"], t["non_compute_time_us"]) == (
        ref["kernel_time(us)"], ref["idle_time(us)"], ref["compute_time(us)"], ref["non_compute_time(us)"])


@pytest.mark.parametrize("name,f", CASES)
def test_overlap_equals_hta(ours: dict, name: str, f: str) -> None:
    ref = _ref(name, f, "overlap")
    if math.isnan(ref):  # no communication kernel: HTA divides 0 by 0
        assert ours[f]["overlap"] is None
    else:  # HTA reports a percentage rounded to two decimals
        assert round(100 * ours[f]["overlap"], 2) == pytest.approx(100 * ref, abs=1e-9)


@pytest.mark.parametrize("name,f", CASES)
def test_launch_statistics_equal_hta(ours: dict, name: str, f: str) -> None:
    ref = _ref(name, f, "launch")
    got = ours[f]["launch"]
    if got is None:  # none of the calls HTA's statistics count: HTA's table is empty
        assert ref["events"] == 0
    else:
        assert {k.removesuffix("_us"): v for k, v in got.items()} == ref


@pytest.mark.parametrize("name,f", CASES)
def test_queue_length_equals_hta(ours: dict, name: str, f: str) -> None:
    """Counts and maxima equal; HTA's mean depends on how its unstable sort orders a launch
    and a kernel start at the same µs, so it is compared to 0.01 of a queue slot."""
    ref = _ref(name, f, "queue")
    got = ours[f]["queue"] or {}
    assert sorted(map(str, got)) == sorted(ref)
    for stream, q in got.items():
        r = ref[str(stream)]
        assert (q["count"], q["max"]) == (r["count"], r["max"])
        assert q["mean"] == pytest.approx(r["mean"], abs=0.02)


def test_our_scope_keeps_what_hta_drops(ours: dict) -> None:
    """Scope `all` keeps the last ProfilerStep and the activities launched before the trace."""
    f = "negative_queue_rank0.json.gz"
    profile = load_profile(HTA / f)
    mine = gpu_time(profile, "all")
    assert mine["activities"] == len(profile.kernels) > ours[f]["activities"]


def test_report_scope_hta_writes_htas_figures(tmp_path: Path) -> None:
    from harness import report

    assert report.main([str(HTA / "ns_resolution_rank0.json.gz"), "--out", str(tmp_path), "--no-plot",
                        "--scope", "hta"]) == 0
    (figures,) = json.loads((tmp_path / "gpu_time.json").read_text())
    ref = REF["sets"]["ns_resolution"]["temporal"]["0"]
    assert figures["scope"] == "hta" and figures["temporal"]["idle_time_us"] == ref["idle_time(us)"]
    assert "## GPU time (Holistic Trace Analysis's definitions)" in (tmp_path / "kernels.md").read_text()


def _events(f: str) -> list[dict]:
    return [e for e in json.loads(gzip.decompress((HTA / f).read_bytes()), parse_float=Decimal)["traceEvents"]
            if e.get("ph") == "X"]


def test_rocm_launch_calls_count_in_scope_all() -> None:
    """HTA's MI250 trace: the HIP calls (hipLaunchKernel, hipExtModuleLaunchKernel,
    hipMemcpyWithStream) launch every GPU activity; scope `all` counts them in the launch
    statistics, by hand from the JSON (ns): delay = GPU start - the call's end, 0 if negative."""
    events = _events("mi250_rocm.json.gz")
    ns = lambda us: int(us * 1000)  # noqa: E731  (Kineto's µs with ns as three decimals)
    calls = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime"
             and e["name"] in ("hipLaunchKernel", "hipExtModuleLaunchKernel", "hipMemcpyWithStream")}
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy")]
    assert len(gpu) == 16 and all(e["args"]["correlation"] in calls for e in gpu)
    delay = sum(max(ns(e["ts"]) - ns(calls[e["args"]["correlation"]]["ts"] + calls[e["args"]["correlation"]]["dur"]),
                    0) for e in gpu)
    got = gpu_time(load_profile(HTA / "mi250_rocm.json.gz"), "all")["launch"]
    assert got["events"] == 16 and got["launch_delay_sum_us"] == pytest.approx(delay / 1000, abs=1e-6)
    assert got["cpu_duration_sum_us"] == pytest.approx(sum(ns(c["dur"]) for c in calls.values()) / 1000, abs=1e-6)


def test_mi250_measures_its_one_step_not_the_empty_one_prof_stop_closed() -> None:
    """HTA's MI250 trace holds ProfilerStep#1, with every GPU activity launched in it, and an
    empty #2 that prof.stop() closed (no record_function inside either). #2 is left out and #1
    measured (with a warning: one step), not #1 set apart as warm-up and #2 left as the only
    step, which refused the trace ("no kernel ran inside a measured range"). Hand count: the
    activities whose HIP call began inside #1, in ns."""
    from harness.trace.analyses.breakdown import breakdown

    events = _events("mi250_rocm.json.gz")
    ns = lambda us: int(us * 1000)  # noqa: E731
    (one,) = [e for e in events if e["name"] == "ProfilerStep#1" and e.get("cat") == "user_annotation"]
    calls = {e["args"]["correlation"]: ns(e["ts"]) for e in events if e.get("cat") == "cuda_runtime"}
    mine = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy")
            and ns(one["ts"]) <= calls[e["args"]["correlation"]] <= ns(one["ts"] + one["dur"])]
    bd = breakdown(load_profile(HTA / "mi250_rocm.json.gz"))
    p = bd.phases["ProfilerStep"]
    assert "the last `ProfilerStep` #2 holds no GPU work" in bd.steady_rule
    assert (p.steps, p.kernels_per_step, p.copies_per_step) == (1, 14, 2) == (
        1, sum(e["cat"] == "kernel" for e in mine), sum(e["cat"] == "gpu_memcpy" for e in mine))
    assert p.gpu_ns_per_step == sum(ns(e["dur"]) for e in mine)


def test_a_folder_of_one_rank_reads_as_that_rank(tmp_path: Path) -> None:
    """HTA's trace_compare/base trace is rank 1 alone (distributedInfo); a folder holding it
    is a set of one rank, not a set missing rank 0, and its figures are HTA's for that folder."""
    from harness import report

    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "base.json.gz").write_bytes((HTA / "trace_compare_base.json.gz").read_bytes())
    assert report.main([str(folder), "--out", str(tmp_path / "out"), "--no-plot", "--scope", "hta"]) == 0
    (figures,) = json.loads((tmp_path / "out" / "gpu_time.json").read_text())
    ref = REF["sets"]["trace_compare_base"]
    assert ref["ranks"] == [1] and figures["label"] == "rank1"
    assert figures["temporal"]["kernel_time_us"] == ref["temporal"]["1"]["kernel_time(us)"]
    assert figures["launch"]["launch_delay_sum_us"] == ref["launch"]["1"]["launch_delay_sum"]
