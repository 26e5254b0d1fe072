"""Library ranges (FSDP::*, nccl:*, compiled regions...) are no phases and no steps: their
kernels count in the program's phase that holds them, and the report lists them per phase.
The FSDP2 fixture's sub-ranges are counted by hand from its JSON with the standard library;
planted profiles check the rules the fixture does not reach."""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import pytest

from harness.reports.breakdown import breakdown_markdown
from harness.reports.ranks import render_ranks
from harness.trace.analyses.breakdown import WHOLE_PROFILE, breakdown
from harness.trace.analyses.ranks import ReportInputs, report_inputs
from harness.trace.library_ranges import group_name, library_of
from harness.trace.profile import Kernel, Profile, Range

FSDP = Path(__file__).parent / "data" / "user_ranks" / "fsdp2"
RANKS = ("rank0.json.gz", "rank1.json.gz")
PHASE_NAMES = ("forward", "backward", "optimizer")


@pytest.fixture(scope="module")
def fsdp() -> ReportInputs:
    """The report's inputs for both ranks, as `harness.report` makes them."""
    return report_inputs([FSDP / name for name in RANKS])


def _ns(us) -> int:
    return int(Decimal(str(us)) * 1000)


OPENED_BY = {"FSDP::": "FSDP", "nccl:": "NCCL", "Optimizer.": "torch.optim"}  # the ranges torch opens here


def _hand(name: str) -> dict[tuple[str, str], tuple[int, int]]:
    """Per (phase, library range name with its block index as `*`): how many such ranges
    (FSDP's, c10d's `nccl:*` and torch.optim's) lie in that phase (its innermost `forward`/`backward`/`optimizer` range, else the step) in the
    measured steps ProfilerStep#2 and #3 (#1 is set apart as the first step), and the ns of
    the GPU activities launched inside one of them on the range's own thread."""
    events = json.loads(gzip.decompress((FSDP / name).read_bytes()), parse_float=Decimal)["traceEvents"]
    spans = [(e["name"], _ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]), (e["pid"], e["tid"])) for e in events
             if e.get("cat") == "user_annotation"]
    steps = [(lo, hi) for n, lo, hi, _ in spans if n in ("ProfilerStep#2", "ProfilerStep#3")]
    phases = [(n, lo, hi) for n, lo, hi, _ in spans if n in PHASE_NAMES]
    launch = {e["args"]["correlation"]: (_ns(e["ts"]), (e["pid"], e["tid"])) for e in events
              if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    gpu = [(launch[e["args"]["correlation"]], _ns(e["dur"])) for e in events
           if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e["args"].get("correlation") in launch]
    count: dict[tuple[str, str], int] = defaultdict(int)
    members: dict[tuple[str, str], list[tuple[int, int, tuple]]] = defaultdict(list)
    for n, lo, hi, thread in spans:
        if not n.startswith(tuple(OPENED_BY)) or not any(a <= lo and hi <= b for a, b in steps):
            continue
        holding = [(b - a, p) for p, a, b in phases if a <= lo and hi <= b]
        key = (min(holding)[1] if holding else "ProfilerStep", re.sub(r"blocks\.\d", "blocks.*", n))
        count[key] += 1
        members[key].append((lo, hi, thread))
    out = {}
    for key, ranges in members.items():
        ns = sum(d for (at, thread), d in gpu if any(lo <= at <= hi and thread == t for lo, hi, t in ranges))
        out[key] = (count[key], ns)
    return out


def test_fsdp2_phases_are_the_programs_own(fsdp: tuple) -> None:
    bds = fsdp.breakdowns
    for bd in bds:
        assert list(bd.phases) == ["ProfilerStep", *PHASE_NAMES]
        assert all(p.steps == 2 for p in bd.phases.values())
        assert not [k for k in bd.phases if "FSDP" in k]


@pytest.mark.parametrize("rank", [0, 1])
def test_fsdp2_sub_ranges_match_hand_count(fsdp: tuple, rank: int) -> None:
    bd = fsdp.breakdowns[rank]
    hand = _hand(RANKS[rank])
    got = {(phase, s.name): s for phase, subs in bd.library_ranges.items() for s in subs}
    assert set(got) == set(hand)
    assert {phase for phase, name in got if name.startswith("FSDP")} == {"forward", "backward"}
    assert got["optimizer", "Optimizer.step#AdamW.step"].per_step == 1
    for key, (n, ns) in hand.items():
        s = got[key]
        assert s.library == next(lib for prefix, lib in OPENED_BY.items() if key[1].startswith(prefix))
        assert s.per_step * 2 == n
        assert s.gpu_ns_per_step * 2 == pytest.approx(ns, abs=1)
        assert s.share == pytest.approx(s.gpu_ns_per_step / bd.phases[key[0]].gpu_ns_per_step)
    # six blocks, two micro-batches: twelve per step of each block's all-gather, forward and backward
    assert got["forward", "FSDP::all_gather (blocks.*)"].per_step == 12
    assert got["backward", "FSDP::all_gather (blocks.*)"].per_step == 12
    assert got["backward", "FSDP::post_backward_reduce (blocks.*)"].per_step == 12


def test_fsdp2_report_is_short_and_lists_sub_ranges_in_one_table(fsdp: tuple) -> None:
    bds, answer_sets, ranks = fsdp.breakdowns, fsdp.answers, fsdp.ranks
    md = breakdown_markdown(bds, answer_sets, sections=render_ranks(ranks))
    lines = md.splitlines()
    assert len(lines) < 400  # 1,447 lines when each FSDP range was a phase with its own tables
    assert not [line for line in lines if line.startswith("### FSDP")]
    assert md.count("## Library ranges inside each phase") == 1
    table = lines[lines.index("## Library ranges inside each phase") + 4:]
    assert table[0] == "| phase | library range | library | rank0 | rank1 |"
    rows = table[2:table.index("")]
    assert len(rows) == len({(p, s.name) for bd in bds for p, subs in bd.library_ranges.items() for s in subs})
    assert "| forward | `FSDP::all_gather (blocks.*)` | FSDP | 12, " in md


@pytest.mark.parametrize("name,library", [
    ("FSDP::all_gather (transformer.h.0)", "FSDP"), ("FSDP::pre_backward", "FSDP"),
    ("DDP::forward", "DDP"), ("DistributedDataParallel.forward", "DDP"),
    ("nccl:all_reduce", "NCCL"), ("ncclAllReduce", "NCCL"), ("c10d::allreduce_", "NCCL"),
    ("Optimizer.step#AdamW.step", "torch.optim"), ("CompiledFunction", "torch.compile"),
    ("Torch-Compiled Region: 0/1", "torch.compile"), ("XlaModule:#hlo_module=jit_step,program_id=3#", "XLA"),
    ("jit_train_step", "XLA"),
    ("forward", None), ("## forward ##", None), ("train_step", None), ("ProfilerStep#3", None),
    ("step", None), ("jitter", None), ("ncclish", None), ("optimizer", None),
])
def test_vocabulary(name: str, library: str | None) -> None:
    assert library_of(name) == library


def test_module_indices_fold_into_one_row() -> None:
    assert group_name("FSDP::all_gather (transformer.h.11)") == "FSDP::all_gather (transformer.h.*)"
    assert group_name("FSDP::backward_prefetch for blocks.3") == "FSDP::backward_prefetch for blocks.*"
    assert group_name("Torch-Compiled Region: 1/0") == "Torch-Compiled Region: 1/0"


def _planted(ranges: list[Range]) -> Profile:
    """Kernels at 2-5, 12-14, 22-28, 32-33, 42-48 and 62-64 (ns), no launch records: by execution."""
    kernels = [Kernel(f"k{i}", a, b) for i, (a, b) in enumerate([(2, 5), (12, 14), (22, 28), (32, 33), (42, 48),
                                                                  (62, 64)])]
    return Profile("planted", "planted", "nsys", kernels, ranges)


LIBRARY = [Range("FSDP::all_gather (blocks.0)", 1, 6), Range("FSDP::all_gather (blocks.1)", 21, 29),
           Range("nccl:all_reduce", 41, 49)]


def test_only_library_ranges_read_as_the_whole_profile() -> None:
    bd = breakdown(_planted(LIBRARY))
    assert list(bd.phases) == [WHOLE_PROFILE]
    assert bd.phases[WHOLE_PROFILE].gpu_ns_per_step == 3 + 2 + 6 + 1 + 6 + 2
    assert "only library ranges (FSDP: `FSDP::all_gather (blocks.*)`; NCCL: `nccl:all_reduce`)" in bd.steady_rule
    assert "the whole profile" in bd.steady_rule
    subs = {s.name: (s.per_step, s.gpu_ns_per_step) for s in bd.library_ranges[WHOLE_PROFILE]}
    assert subs == {"FSDP::all_gather (blocks.*)": (2, 3 + 6), "nccl:all_reduce": (1, 6)}
    md = breakdown_markdown([bd])
    assert sum("only library ranges" in line for line in md.splitlines()) == 1
    assert "| (whole profile) | `nccl:all_reduce` | NCCL | 1, 0.000 ms, 30.0% |" in md


def test_steps_and_only_library_ranges_read_as_one_phase_per_step() -> None:
    steps = [Range("ProfilerStep#1", 0, 10), Range("ProfilerStep#2", 20, 30), Range("ProfilerStep#3", 40, 50)]
    bd = breakdown(_planted(steps + LIBRARY))
    assert list(bd.phases) == ["ProfilerStep"] and bd.phases["ProfilerStep"].steps == 2
    assert "only library ranges" in bd.steady_rule and "each step reads as one phase" in bd.steady_rule
    subs = {s.name: (s.per_step, s.gpu_ns_per_step) for s in bd.library_ranges["ProfilerStep"]}
    assert subs == {"FSDP::all_gather (blocks.*)": (0.5, 3.0), "nccl:all_reduce": (0.5, 3.0)}


def test_library_ranges_change_no_figure_of_the_phases() -> None:
    own = [Range("step", 0, 30), Range("forward", 1, 15), Range("backward", 16, 30),
           Range("step", 40, 70), Range("forward", 41, 55), Range("backward", 56, 70)]
    alone, folded = breakdown(_planted(own)), breakdown(_planted(own + LIBRARY))
    assert folded.phases == alone.phases and list(folded.phases) == ["step", "forward", "backward"]
    assert folded.steady_rule == alone.steady_rule and "only library" not in folded.steady_rule
    # the first step is set apart: the steady step holds one `nccl:all_reduce`, inside `forward`
    assert {p: [(s.name, s.per_step, s.gpu_ns_per_step) for s in subs] for p, subs in folded.library_ranges.items()} \
        == {"forward": [("nccl:all_reduce", 1, 6)]}


def test_profiler_step_inside_the_programs_step_is_a_library_range() -> None:
    ranges = [Range("step", 0, 30), Range("ProfilerStep#1", 1, 29), Range("forward", 2, 15),
              Range("step", 40, 70), Range("ProfilerStep#2", 41, 69), Range("forward", 41, 55)]
    bd = breakdown(_planted(ranges))
    assert list(bd.phases) == ["step", "forward"]
    assert [(s.name, s.library, s.per_step, s.gpu_ns_per_step) for s in bd.library_ranges["step"]] == [
        ("ProfilerStep", "torch.profiler", 1, 6 + 2)]


@pytest.mark.parametrize("rank", [0, 1])
def test_fsdp2_copy_in_is_memory_not_the_optimizer(fsdp: tuple, rank: int) -> None:
    """FSDP2's all-gather copy-in runs the foreach kernel the optimizer runs; inside the
    `FSDP::all_gather (...)` ranges it is memory. Its time per phase, counted by hand: the
    foreach kernels launched inside one of those ranges, on its thread, in the measured steps."""
    events = json.loads(gzip.decompress((FSDP / RANKS[rank]).read_bytes()), parse_float=Decimal)["traceEvents"]
    spans = [(e["name"], _ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]), (e["pid"], e["tid"])) for e in events
             if e.get("cat") == "user_annotation"]
    steps = [(lo, hi) for n, lo, hi, _ in spans if n in ("ProfilerStep#2", "ProfilerStep#3")]
    phases = [(n, lo, hi) for n, lo, hi, _ in spans if n in PHASE_NAMES]
    gathers = [(lo, hi, t) for n, lo, hi, t in spans if n == "FSDP::all_gather" or n.startswith("FSDP::all_gather (")]
    launch = {e["args"]["correlation"]: (_ns(e["ts"]), (e["pid"], e["tid"])) for e in events
              if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    hand: dict[str, int] = defaultdict(int)
    for e in events:
        if (e.get("cat") != "kernel" or "multi_tensor_apply_kernel" not in e["name"]
                or e["args"].get("correlation") not in launch):
            continue
        at, thread = launch[e["args"]["correlation"]]
        if any(lo <= at <= hi and t == thread for lo, hi, t in gathers) and any(a <= at <= b for a, b in steps):
            hand[next(n for n, lo, hi in phases if lo <= at <= hi)] += _ns(e["dur"])
    assert set(hand) == {"forward", "backward"}
    bd = fsdp.breakdowns[rank]
    for phase in ("forward", "backward"):
        p = bd.phases[phase]
        assert "optimizer" not in p.categories
        copy_in = [k for k in p.kernels if "multi_tensor_apply_kernel" in k.name]
        assert {(k.category, k.inferred_from) for k in copy_in} == {("copy_memset_transpose", "FSDP::all_gather")}
        assert sum(k.ns_per_step for k in copy_in) * 2 == pytest.approx(hand[phase], abs=2)
    assert bd.phases["optimizer"].categories["optimizer"] > 0  # AdamW's own foreach update stays the optimizer
