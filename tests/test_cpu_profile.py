"""The CPU breakdown from torch.profiler, on real traces of `harness.run --profile` on a CPU.

Fixtures (tests/data/torch_cpu/, captured on a 2-core CPU machine with
``python -m harness.run --backend torch --model {tiny,mini} --ctx 64 --device cpu
--warmup 1 --steps 2 --profile torch_{tiny,mini}_cpu.json``): torch.profiler's Chrome
traces, the trace's own path and host name blanked.  On a CPU, ATen ops nest
(``aten::linear`` -> ``aten::matmul`` -> ``aten::mm`` -> ``aten::resolve_conj``), so
which op's time counts decides what the report ranks first.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import pytest

from harness.reports import breakdown as render
from harness.trace.analyses.breakdown import answers, breakdown, load_profile
from harness.trace.kernels import Category

DATA = Path(__file__).parent / "data" / "torch_cpu"
MODELS = ("tiny", "mini")


def trace(model: str) -> Path:
    return DATA / f"torch_{model}_cpu.json.gz"


def _events(model: str) -> tuple[list[dict], list[dict]]:
    """The trace's cpu_op events and its `forward` ranges."""
    events = [e for e in json.loads(gzip.decompress(trace(model).read_bytes()))["traceEvents"]
              if e.get("ph") == "X" and "dur" in e]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    forwards = [e for e in events if e.get("cat") == "user_annotation" and e["name"] == "forward"]
    return ops, forwards


def _measured_forwards(ops: list[dict], forwards: list[dict]) -> list[dict]:
    """The forward ranges of the measured steps: the trace's last two (one warm-up, two steps)."""
    assert len(forwards) == 3
    return sorted(forwards, key=lambda e: e["ts"])[1:]


def _inside(e: dict, r: dict) -> bool:
    return r["ts"] <= e["ts"] and e["ts"] + e["dur"] <= r["ts"] + r["dur"]


@pytest.mark.parametrize("model", MODELS)
def test_matmuls_come_first_on_a_cpu(model: str) -> None:
    """aten::mm calls aten::resolve_conj: an innermost-op rule drops every matmul and ranks
    the loss's log-softmax first; counted by self time, the matmuls lead."""
    bd = breakdown(load_profile(trace(model)))
    fwd, step = bd.phases["forward"], bd.phases["step"]
    assert fwd.kernels[0].name == "aten::mm" and step.kernels[0].name == "aten::mm"
    assert max(fwd.categories, key=fwd.categories.get) == Category.GEMM.value
    assert max(step.categories, key=step.categories.get) == Category.GEMM.value
    assert answers(bd)["b"]["name"] == "aten::mm"


@pytest.mark.parametrize("model", MODELS)
def test_op_time_is_each_ops_self_time_counted_once(model: str) -> None:
    """Per forward: the ops' summed time equals the wall time of the outermost ops (hand
    count: nothing counted twice, nothing dropped); aten::mm's equals its events' durations
    less their nested ops' (resolve_conj)."""
    ops, forwards = _events(model)
    measured = _measured_forwards(ops, forwards)
    outer_us = mm_us = 0.0
    for r in measured:
        inside = [e for e in ops if _inside(e, r)]
        by_thread: dict[object, list[dict]] = defaultdict(list)
        for e in inside:
            by_thread[e["tid"]].append(e)
        for evs in by_thread.values():
            outer_us += sum(e["dur"] for e in evs if not any(o is not e and _inside(e, o) and o["dur"] > e["dur"]
                                                             for o in evs))
        for mm in (e for e in inside if e["name"] == "aten::mm"):
            nested = [e for e in inside if e is not mm and e["tid"] == mm["tid"] and _inside(e, mm)]
            mm_us += mm["dur"] - sum(e["dur"] for e in nested)
    bd = breakdown(load_profile(trace(model)))
    fwd = bd.phases["forward"]
    assert fwd.steps == 2
    # each op's start and end are rounded to whole ns: at most 1 ns per op and step
    assert fwd.gpu_ns_per_step == pytest.approx(outer_us * 1e3 / 2, abs=2 * fwd.kernels_per_step)
    mm = next(k for k in fwd.kernels if k.name == "aten::mm")
    assert mm.ns_per_step == pytest.approx(mm_us * 1e3 / 2, abs=2 * mm.calls_per_step * 2)


def test_cpu_report_speaks_of_cpu_ops() -> None:
    """No "GPU ms", no kernels, no copy counts and no GEMM decoding for CPU ops."""
    bd = breakdown(load_profile(trace("tiny")))
    assert bd.cpu_ops
    md = render.breakdown_markdown([bd])
    assert "GPU ms" not in md and "GPU time in" not in md
    assert "kernels/step" not in md and "top kernels" not in md and "| kernel |" not in md
    assert "| step | CPU ms/step |" in md and "| step | ops/step |" in md
    assert "memcpys" not in md and "GEMM kernels decoded" not in md
    assert "- (b) top forward op: `aten::mm`" in md
    assert render.busy([bd]) == "CPU"


JAX_TRACE = Path(__file__).parent / "data" / "jax_cpu" / "jax_while_cpu.xplane.pb.gz"


def test_xla_thunks_nested_in_a_while_thunk_count_once() -> None:
    """tests/data/jax_cpu (capture_while.py there, run on the same CPU machine): a jitted
    step whose matmuls run in a `fori_loop`. XLA's `while` thunk holds its body's thunks on
    the same thread: per thread, the thunks' summed time must equal the wall time their
    union covers (hand count from the raw trace), not the loop's time twice."""
    from jax.profiler import ProfileData

    from harness.trace.sources import framework_profile

    data = ProfileData.from_serialized_xspace(gzip.decompress(JAX_TRACE.read_bytes()))
    by_line: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for plane in (p for p in data.planes if p.name == "/host:CPU"):
        for line_no, line in enumerate(plane.lines):
            for e in line.events:
                if any(k == "hlo_op" for k, _ in e.stats):
                    by_line[line_no].append((int(e.start_ns), int(e.start_ns + e.duration_ns)))
    union = nested = 0
    for spans in by_line.values():
        end = 0  # where the union so far ends
        for s, e in sorted(spans):
            nested += s < end
            union += max(e - max(s, end), 0)
            end = max(end, e)
    assert nested >= 3 * 4 * 3  # three steps of four iterations of three thunks, each inside `while`
    prof = framework_profile.load_jax_trace(JAX_TRACE)
    assert prof.cpu_ops and "self time" in prof.notes[0]
    assert int(prof.kernels.duration.sum()) == union
    bd = breakdown(prof)
    assert bd.phases["step"].kernels[0].name == "ynn_fusion"  # the matmul, not the loop around it


# Thunk names of XLA's CPU backend from a real `harness.run --backend jax --model tiny --ctx 16
# --device cpu --framework-profile` (jax 0.10.2): its dots run as `dot` thunks and in YNNPACK
# fusions; the other fusions hold no dot (by the run's optimized HLO).
XLA_CPU_GEMMS = ("ynn_fusion", "ynn_fusion.23", "dot", "dot.3")
XLA_CPU_OTHERS = {"multiply_add_fusion": Category.ELEMENTWISE, "wrapped_broadcast": Category.ELEMENTWISE,
                  "subtract_add_fusion": Category.ELEMENTWISE, "copy_bitcast_fusion": Category.MEMORY,
                  "multiply_reduce_fusion": Category.REDUCTION, "wrapped_reduce": Category.REDUCTION}


def test_xla_cpu_matmuls_count_as_gemm() -> None:
    """On a CPU, JAX's matmuls ran as `ynn_fusion` thunks, which the `fusion` pattern made
    elementwise: the fixture's step (a 256x256 matmul, an add and a tanh per iteration) had
    no GEMM time at all. Its GEMM time is the ynn_fusion thunks' time inside the measured
    `step` ranges, summed from the profile's own tables; the add and the tanh stay elementwise."""
    from harness.trace.kernels import classify
    from harness.trace.sources import framework_profile

    prof = framework_profile.load_jax_trace(JAX_TRACE)
    bd = breakdown(prof)
    steps = bd.phases["step"].steps
    measured = [r for r in prof.ranges if r.name == "step"][-steps:]  # the first step is reported apart
    kt = prof.kernels
    by_name: dict[str, int] = defaultdict(int)
    for i in range(len(kt)):
        if any(r.start <= kt.start[i] < r.end for r in measured):
            by_name[kt.name_of(i)] += int(kt.duration[i])
    cats = bd.phases["step"].categories
    assert cats["gemm"] == pytest.approx(by_name["ynn_fusion"] / steps)
    assert cats["elementwise"] == pytest.approx((by_name["wrapped_add"] + by_name["wrapped_tanh"]) / steps)
    assert all(classify(name) == Category.GEMM for name in XLA_CPU_GEMMS)
    assert {name: classify(name) for name in XLA_CPU_OTHERS} == XLA_CPU_OTHERS


def test_trace_viewer_export_of_xla_thunks_counts_each_once() -> None:
    """The same program's trace-viewer export (`.trace.json.gz`, jax_cpu/capture_while.py):
    read by the file's content (its `/host:CPU` process), the thunks (events with an `hlo_op`
    arg) count once each per thread, as the union of their spans counted here from the JSON."""
    path = JAX_TRACE.with_name("jax_while_cpu.trace.json.gz")
    events = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)["traceEvents"]
    by_thread: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and "hlo_op" in e.get("args", {}):
            s = round(Decimal(e["ts"]) * 1000)
            by_thread[e["tid"]].append((s, s + round(Decimal(e["dur"]) * 1000)))
    union = 0
    for spans in by_thread.values():
        end = 0
        for s, e in sorted(spans):
            union += max(e - max(s, end), 0)
            end = max(end, e)
    assert sum(map(len, by_thread.values())) == 3 * (1 + 4 * 3 + 2)  # per step: while, 4 x 3 in it, 2 copies
    prof = load_profile(path)
    assert prof.source == "jax.profiler" and prof.cpu_ops and "self time" in prof.notes[0]
    assert int(prof.kernels.duration.sum()) == union
    bd = breakdown(prof)
    assert bd.phases["step"].steps == 2 and bd.phases["step"].kernels[0].name == "ynn_fusion"
