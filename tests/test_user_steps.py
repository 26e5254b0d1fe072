"""Steps in programs the harness did not write: numbered ranges are instances of one range,
torch.profiler's ProfilerStep#N are steps, record_function ranges are phases. Hand counts
come from the trace's JSON, joined here with the standard library."""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path

import pytest

from harness.trace.analyses.breakdown import breakdown, load_profile
from harness.trace.profile import Range, numbered_instances

HTA = Path(__file__).parent / "data" / "hta"


@pytest.mark.parametrize("names,base", [
    (["step0", "step1", "step7"], "step"),
    (["step 3", "step 12"], "step"),
    (["iteration_3", "iteration_4"], "iteration"),
    (["train_step[7]", "train_step[8]"], "train_step"),
    (["ProfilerStep#551", "ProfilerStep#552"], "ProfilerStep"),
])
def test_numbered_names_are_one_range(names: list[str], base: str) -> None:
    ranges = [Range(n, 10 * i, 10 * i + 5) for i, n in enumerate(names)]
    out, rule = numbered_instances(ranges)
    assert {r.name for r in out} == {base}
    assert [r.number for r in out] == [int("".join(c for c in n if c.isdigit())) for n in names]
    assert f"`{base}`" in rule


def test_a_lone_number_is_part_of_the_name() -> None:
    out, rule = numbered_instances([Range("fp8", 0, 5), Range("forward", 0, 9), Range("conv2", 9, 12)])
    assert [r.name for r in out] == ["fp8", "forward", "conv2"] and rule == ""


def _ns(us) -> int:
    return int(Decimal(str(us)) * 1000)


@pytest.fixture(scope="module")
def resnet() -> dict:
    """ns_resolution_rank0 (a ResNet under torch.profiler): ranges per name and each kernel's
    launch time, by hand."""
    events = json.loads(gzip.decompress((HTA / "ns_resolution_rank0.json.gz").read_bytes()),
                        parse_float=Decimal)["traceEvents"]
    ranges: dict[str, list[tuple[int, int]]] = {}
    for e in events:
        if e.get("cat") == "user_annotation":
            ranges.setdefault(e["name"], []).append((_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])))
    launch = {e["args"]["correlation"]: _ns(e["ts"]) for e in events if e.get("cat") == "cuda_runtime"}
    kernels = [(launch.get(e["args"]["correlation"]), _ns(e["dur"]), e["cat"] == "kernel") for e in events
               if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    return {"ranges": ranges, "kernels": kernels}


def _launched_in(hand: dict, name: str) -> tuple[int, int]:
    """(kernels, ns of kernels, memcpys and memsets) launched inside a range named `name`."""
    spans = [s for n, ss in hand["ranges"].items() if n == name or n.startswith(name + "#") for s in ss]
    hits = [(d, k) for at, d, k in hand["kernels"] if at is not None and any(lo <= at <= hi for lo, hi in spans)]
    return sum(k for _, k in hits), sum(d for d, _ in hits)


@pytest.mark.parametrize("phase,hand_name", [("ProfilerStep", "ProfilerStep"), ("## forward ##", "## forward ##"),
                                             ("## backward ##", "## backward ##"),
                                             ("## optimizer ##", "## optimizer ##")])
def test_profiler_steps_and_record_function_phases_match_hand_count(resnet: dict, phase: str,
                                                                     hand_name: str) -> None:
    bd = breakdown(load_profile(HTA / "ns_resolution_rank0.json.gz"))
    steps = [n for n in resnet["ranges"] if n.startswith("ProfilerStep#")]
    assert len(steps) == 5
    # ProfilerStep#101 is not the program's first step: every recorded step is measured
    assert "`ProfilerStep` (5 numbers, 101 to 105)" in bd.steady_rule and "all 5 are measured" in bd.steady_rule
    assert bd.attribution == "launch"  # the program does not synchronize at phase ends
    p = bd.phases[phase]
    kernels, ns = _launched_in(resnet, hand_name)
    assert p.steps == 5
    assert p.kernels_per_step * 5 == kernels
    assert p.gpu_ns_per_step * 5 == pytest.approx(ns, abs=1)  # a sum of exact ns, divided and multiplied


def test_torch_own_ranges_are_no_phases() -> None:
    bd = breakdown(load_profile(HTA / "ns_resolution_rank0.json.gz"))
    assert not [k for k in bd.phases if k.startswith(("Optimizer.", "nccl:", "DistributedDataParallel."))]
