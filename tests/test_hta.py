"""HTA's analyses matched on HTA's own test traces: the figures HolisticTraceAnalysis
computed (tests/data/hta/hta_figures.json, written by hta_figures.py beside it, with the
HTA version named there) against ours in HTA's scope. HTA is not imported here."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from harness.trace.analyses.breakdown import load_profile
from harness.trace.analyses.gpu_time import gpu_time

HTA = Path(__file__).parent / "data" / "hta"
REF = json.loads((HTA / "hta_figures.json").read_text())
CASES = [("sampled", "sampled_rank-0.json.gz"), ("sampled", "sampled_rank-1.json.gz"),
         ("negative_queue", "negative_queue_rank0.json.gz"), ("ns_resolution", "ns_resolution_rank0.json.gz")]


@pytest.fixture(scope="module")
def ours() -> dict:
    return {f: gpu_time(load_profile(HTA / f), "hta") for _, f in CASES}


def _ref(name: str, f: str, what: str) -> dict:
    rank = str(load_profile(HTA / f).rank)
    return REF["sets"][name][what][rank]


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
    assert {k.removesuffix("_us"): v for k, v in got.items()} == ref


@pytest.mark.parametrize("name,f", CASES)
def test_queue_length_equals_hta(ours: dict, name: str, f: str) -> None:
    """Counts and maxima equal; HTA's mean depends on how its unstable sort orders a launch
    and a kernel start at the same µs, so it is compared to 0.01 of a queue slot."""
    ref = _ref(name, f, "queue")
    got = ours[f]["queue"]
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
