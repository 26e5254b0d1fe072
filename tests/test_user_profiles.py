"""Profiles of a user's own DDP loop (tests/data/user_profiles: `nsys profile torchrun` with
two processes, and the same loop's torch.profiler traces, one per rank): per-rank, per-step
figures against hand counts made here with SQL on the export and JSON parsing of the
traces, not through the code under test.

The loop does not synchronize at phase ends, so the report attributes by launch: a kernel
belongs to the range its launch call (CUPTI correlation) began in, on any thread of its
process (PyTorch launches the backward from its autograd thread)."""

from __future__ import annotations

import gzip
import json
import sqlite3
from decimal import Decimal
from pathlib import Path

import pytest

from harness.trace.analyses.ranks import report_inputs
from harness.trace.kernels import Category

DATA = Path(__file__).parent / "data" / "user_profiles"
PHASES = ("step", "forward", "backward", "optimizer")


@pytest.fixture(scope="module")
def nsys(tmp_path_factory: pytest.TempPathFactory) -> tuple[sqlite3.Connection, list]:
    path = tmp_path_factory.mktemp("ddp") / "ddp_loop.sqlite"
    path.write_bytes(gzip.decompress((DATA / "ddp_loop.sqlite.gz").read_bytes()))
    return sqlite3.connect(path), report_inputs([DATA / "ddp_loop.sqlite.gz"])


def _processes(con: sqlite3.Connection) -> list[int]:
    return [p for p, in con.execute("SELECT DISTINCT globalPid >> 24 FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY 1")]


def _spans(con: sqlite3.Connection, process: int, name: str) -> list[tuple[int, int]]:
    """`name` ranges of one process (`step` matches step0..step7), by start."""
    like = "step%" if name == "step" else name
    return con.execute("SELECT n.start, n.end FROM NVTX_EVENTS n LEFT JOIN StringIds s ON n.textId = s.id "
                       "WHERE COALESCE(n.text, s.value) LIKE ? AND n.eventType = 59 AND n.globalTid >> 24 = ? "
                       "ORDER BY n.start", (like, process)).fetchall()


def _launched(con: sqlite3.Connection, process: int, spans: list[tuple[int, int]], table: str,
              one_off: set[int] = frozenset()) -> tuple[int, int]:
    """(records, ns) of `table` whose launch call, in `process`, began inside one of `spans`;
    kernels named in `one_off` left out."""
    name = "k.demangledName" if table.endswith("KERNEL") else "-1"
    rows = [row for lo, hi in spans for row in con.execute(
        f"SELECT {name}, k.end - k.start FROM {table} k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
        "ON r.correlationId = k.correlationId AND r.globalTid >> 24 = k.globalPid >> 24 "
        "WHERE k.globalPid >> 24 = ? AND r.start BETWEEN ? AND ?", (process, lo, hi))]
    kept = [ns for n, ns in rows if n not in one_off]
    return len(kept), sum(kept)


def _one_off(con: sqlite3.Connection, process: int, steady: list[tuple[int, int]]) -> set[int]:
    """Kernel names launched in the first steady step and in no later one (DDP's one
    broadcast): the report keeps them out of the per-step figures."""
    def names(spans: list[tuple[int, int]]) -> set[int]:
        return {n for lo, hi in spans for n, in con.execute(
            "SELECT k.demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
            "ON r.correlationId = k.correlationId AND r.globalTid >> 24 = k.globalPid >> 24 "
            "WHERE k.globalPid >> 24 = ? AND r.start BETWEEN ? AND ?", (process, lo, hi))}
    return names(steady[:1]) - names(steady[1:])


def test_nsys_torchrun_is_two_ranks_of_eight_steps(nsys) -> None:
    con, inputs = nsys
    bds, (table,) = inputs.breakdowns, inputs.ranks
    assert [bd.label for bd in bds] == ["ddp_loop rank0", "ddp_loop rank1"]
    assert table["ranks"] == [0, 1] and table["rank_source"].startswith("process order")
    for process, bd in zip(_processes(con), bds):
        assert len(_spans(con, process, "step")) == 8  # counted by hand: step0..step7 in each process
        assert "`step` (8 numbers, 0 to 7)" in bd.steady_rule and "the first of 8 `step` ranges" in bd.steady_rule
        assert bd.attribution == "launch"
        assert {name: p.steps for name, p in bd.phases.items()} == dict.fromkeys(PHASES, 7)


@pytest.mark.parametrize("phase", PHASES)
def test_nsys_per_rank_per_step_figures_match_hand_count(nsys, phase: str) -> None:
    con, inputs = nsys
    bds = inputs.breakdowns
    for process, bd in zip(_processes(con), bds):
        steady = _spans(con, process, "step")[1:]  # step0 is reported apart as the first step
        spans = [s for s in _spans(con, process, phase) if any(lo <= s[0] and s[1] <= hi for lo, hi in steady)]
        one_off = _one_off(con, process, steady)
        assert len(one_off) == 1  # ncclDevKernel_Broadcast_RING_LL, twice in step1 only
        kernels, kernel_ns = _launched(con, process, spans, "CUPTI_ACTIVITY_KIND_KERNEL", one_off)
        copies = [_launched(con, process, spans, t) for t in ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")]
        p = bd.phases[phase]
        assert p.kernels_per_step * 7 == kernels
        assert p.copies_per_step * 7 == sum(c for c, _ in copies)
        assert p.gpu_ns_per_step * 7 == pytest.approx(kernel_ns + sum(ns for _, ns in copies), abs=1)


def test_nsys_ranges_are_never_matched_across_processes(nsys) -> None:
    _, inputs = nsys
    bds = inputs.breakdowns
    for bd in bds:  # eight steps of one process, not sixteen
        assert bd.phases["step"].occurrences == 7


def _ns(us) -> int:
    return int(Decimal(str(us)) * 1000)


def _kineto_hand(path: Path) -> dict:
    """Per phase of the one complete ProfilerStep: kernels and GPU ns launched inside it."""
    events = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)["traceEvents"]
    ranges = {}
    for e in events:
        if e.get("cat") == "user_annotation":
            ranges.setdefault(e["name"].split("#")[0], []).append((_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])))
    launch = {e["args"]["correlation"]: _ns(e["ts"]) for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    complete = ranges["ProfilerStep"][0]  # the last, #8, holds no phase: closed by prof.stop()
    out = {"steps": len(ranges["ProfilerStep"])}
    for name in ("ProfilerStep", "forward", "backward", "optimizer"):
        spans = [s for s in ranges[name] if complete[0] <= s[0] and s[1] <= complete[1]]
        gpu = [(e["cat"], _ns(e["dur"])) for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
               and any(lo <= launch.get(e["args"]["correlation"], -1) <= hi for lo, hi in spans)]
        out[name] = (sum(c == "kernel" for c, _ in gpu), sum(d for _, d in gpu))
    return out


def test_torch_profiler_traces_per_rank_match_hand_count() -> None:
    inputs = report_inputs([DATA / "torch_profiler"])
    bds, (table,) = inputs.breakdowns, inputs.ranks
    assert [bd.label for bd in bds] == ["rank0", "rank1"]
    assert "torch.distributed's rank" in table["rank_source"]
    for rank, bd in enumerate(bds):
        hand = _kineto_hand(DATA / "torch_profiler" / f"rank{rank}.json.gz")
        assert hand["steps"] == 2 and "#8 holds none of the phases" in bd.steady_rule
        assert bd.attribution == "launch"
        for name in ("ProfilerStep", "forward", "backward", "optimizer"):
            p = bd.phases[name]
            assert p.steps == 1
            assert (p.kernels_per_step, p.gpu_ns_per_step) == hand[name]


def test_flax_loop_steps_from_step_trace_annotation_match_hand_count() -> None:
    """jax.profiler's own trace: the steps are StepTraceAnnotation("train", step_num=2..5);
    each device event goes to the step whose host event with the same correlation_id (the
    CUDA graph's cuGraphLaunch) began inside it, counted here from the XSpace."""
    from jax.profiler import ProfileData

    from harness.trace.analyses.breakdown import breakdown, load_profile

    path = DATA / "jax" / "flax_loop.xplane.pb.gz"
    space = ProfileData.from_serialized_xspace(gzip.decompress(path.read_bytes()))
    steps, launch, device = [], {}, []
    for plane in space.planes:
        for line in plane.lines:
            for e in line.events:
                stats = dict(e.stats)
                if plane.name == "/host:CPU" and "step_num" in stats:
                    steps.append((int(e.start_ns), int(e.start_ns + e.duration_ns), stats["step_num"]))
                elif plane.name == "/host:CPU" and "correlation_id" in stats:
                    launch[stats["correlation_id"]] = int(e.start_ns)
                elif plane.name.startswith("/device:GPU"):
                    device.append((stats["correlation_id"], e.name, int(e.duration_ns)))
    assert sorted(n for _, _, n in steps) == [2, 3, 4, 5]
    per_step = {n: [(name, d) for c, name, d in device if lo <= launch[c] <= hi] for lo, hi, n in steps}
    kernels = {n: sum(not name.startswith("Memset") for name, _ in evs) for n, evs in per_step.items()}
    assert set(kernels.values()) == {220}  # one CUDA graph of 220 kernels and 5 memsets per step
    total_ns = sum(d for evs in per_step.values() for _, d in evs)

    bd = breakdown(load_profile(path))
    p = bd.phases["train"]
    assert "number 2, not the program's first step: all 4 are measured" in bd.steady_rule
    assert (p.steps, p.kernels_per_step, p.copies_per_step) == (4, 220, 5)
    assert p.gpu_ns_per_step * 4 == pytest.approx(total_ns, abs=1)
    assert sum(p.categories.values()) == pytest.approx(p.gpu_ns_per_step)
    assert p.share(Category.GEMM) > 0.5  # cuBLAS GEMMs, classified as on the nsys path


def test_flax_loop_trace_viewer_export_reads_like_its_xspace(tmp_path: Path) -> None:
    """jax.profiler's trace-viewer export (`<host>.trace.json.gz`, the file users open in
    Perfetto; a real H100 capture): the kernels are the `/device:GPU:0` process's stream
    threads, the steps the `train` events with a `step_num` arg, each kernel in the step whose
    host event with the same `correlation_id` began inside it, all counted here from the JSON."""
    from harness.trace.analyses.breakdown import breakdown, load_profile

    path = DATA / "jax" / "flax_loop.trace.json.gz"
    events = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)["traceEvents"]
    meta = {(e["pid"], e.get("tid") if e["name"] == "thread_name" else None): e["args"]["name"]
            for e in events if e.get("ph") == "M" and e["name"] in ("process_name", "thread_name")}
    ns = lambda us: round(Decimal(us) * 1000)  # noqa: E731  (µs as doubles: 1.3120000000000001)
    steps, launch, device = [], {}, []
    for e in events:
        if e.get("ph") != "X":
            continue
        process, thread, args = meta[(e["pid"], None)], meta.get((e["pid"], e["tid"]), ""), e.get("args", {})
        if process == "/host:CPU" and "step_num" in args:
            steps.append((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), int(args["step_num"])))
        elif process == "/host:CPU" and "correlation_id" in args:
            launch[args["correlation_id"]] = ns(e["ts"])
        elif process == "/device:GPU:0" and thread.startswith("Stream"):
            device.append((args["correlation_id"], e["name"], ns(e["dur"])))
    assert sorted(n for _, _, n in steps) == [2, 3, 4, 5] and len(device) == 900
    per_step = {n: [(name, d) for c, name, d in device if lo <= launch[c] <= hi] for lo, hi, n in steps}
    kernels = {n: sum(not name.startswith("Memset") for name, _ in evs) for n, evs in per_step.items()}
    assert set(kernels.values()) == {220}  # one CUDA graph of 220 kernels and 5 memsets per step
    total_ns = sum(d for evs in per_step.values() for _, d in evs)

    profile = load_profile(path)
    assert (profile.source, len(profile.kernels), profile.cpu_ops) == ("jax.profiler", 900, False)
    bd = breakdown(profile)
    p = bd.phases["train"]
    assert "number 2, not the program's first step: all 4 are measured" in bd.steady_rule
    assert (p.steps, p.kernels_per_step, p.copies_per_step) == (4, 220, 5)
    assert p.gpu_ns_per_step * 4 == total_ns
    assert p.share(Category.GEMM) > 0.5


def _all_reduces(con: sqlite3.Connection, process: int, steady: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(start, end) of the NCCL all-reduce kernels whose launch call began in a steady step."""
    return [row for lo, hi in steady for row in con.execute(
        "SELECT k.start, k.end FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
        "ON r.correlationId = k.correlationId AND r.globalTid >> 24 = k.globalPid >> 24 "
        "JOIN StringIds s ON s.id = k.demangledName "
        "WHERE k.globalPid >> 24 = ? AND r.start BETWEEN ? AND ? AND s.value LIKE 'ncclDevKernel_AllReduce%' "
        "ORDER BY k.start", (process, lo, hi))]


def test_nsys_communication_per_rank_matches_hand_count(nsys) -> None:
    """Each rank's communication per step counts the collectives the per-step figures count
    (the seven steady steps, by launch: the loop does not synchronize, so a step's
    all-reduces run after its range ends), and the k-th all-reduce of one rank is set
    against the k-th of the other: waiting + transfer by hand, from the kernels' times."""
    con, inputs = nsys
    (table,) = inputs.ranks
    ops = {}
    for rank, process in enumerate(_processes(con)):
        steady = _spans(con, process, "step")[1:]
        ops[rank] = _all_reduces(con, process, steady)
        comm = table["communication"][rank]
        assert comm["step_ranges"] == 7
        assert comm["per_step"]["step"]["communication_ms"] == pytest.approx(
            sum(e - s for s, e in ops[rank]) / 7 / 1e6, rel=1e-9)  # one NCCL stream: no overlap among them
    assert len(ops[0]) == len(ops[1]) == table["split"]["collectives"] == 28  # 4 buckets x 7 steps
    split = {r["rank"]: r for r in table["split"]["ranks"]}
    for rank in (0, 1):
        last = [max(ops[0][k][0], ops[1][k][0]) for k in range(28)]
        waiting = sum(lo - ops[rank][k][0] for k, lo in enumerate(last)) / 7 / 1e6
        transfer = sum(ops[rank][k][1] - lo for k, lo in enumerate(last)) / 7 / 1e6
        assert split[rank]["waiting_ms_per_step"] == pytest.approx(waiting, rel=1e-9)
        assert split[rank]["transfer_ms_per_step"] == pytest.approx(transfer, rel=1e-9)


def test_torch_profiler_ranks_share_one_clock_and_align() -> None:
    """torch.profiler's traces count from one wall-clock base (baseTimeNanoseconds): the
    ranks' all-reduces align, and the transfer, the same operation on both, agrees."""
    (table,) = report_inputs([DATA / "torch_profiler"]).ranks
    split = table["split"]
    assert split is not None and split["collectives"] == 4  # DDP's 4 buckets in the one complete step
    t0, t1 = (r["transfer_ms_per_step"] for r in split["ranks"])
    assert abs(t0 - t1) < 0.1 * max(t0, t1)
    for r in split["ranks"]:
        assert r["waiting_ms_per_step"] + r["transfer_ms_per_step"] == pytest.approx(r["communication_ms_per_step"])
