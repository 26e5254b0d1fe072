"""The answer at the top of a report, on a user's FSDP2 loop the project did not write
(tests/data/user_ranks: two ranks, torch.profiler per rank): each line's figures against
hand counts made here from the traces' JSON, and the verdict rules on planted figures."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from harness.common.answer import GPU_BOUND, HOST_BOUND, MAX_FINDINGS, Finding, answer_markdown, bound, bound_text
from harness.trace.analyses.findings import report_findings
from harness.trace.analyses.ranks import report_inputs

FSDP2 = Path(__file__).parent / "data" / "user_ranks" / "fsdp2"


def _steps_and_work(path: Path) -> tuple[dict, list[dict], list[dict]]:
    """The trace, its measured steps (every ProfilerStep but the first, which compiles) and
    the GPU work launched inside them (a launch call's correlation id inside a step)."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    ev = doc["traceEvents"]
    steps = sorted((e for e in ev if str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])[1:]
    launch = {e["args"]["correlation"]: e["ts"] for e in ev
              if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    work = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
            and any(s["ts"] <= launch.get(e["args"].get("correlation"), -1) <= s["ts"] + s["dur"] for s in steps)]
    return doc, steps, work


def _merged(intervals: list[tuple[float, float]]) -> list[list[float]]:
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _hand(path: Path) -> dict:
    """Per step (ms): the step's wall time, the union of its GPU work, and its NCCL kernel
    time not under a compute kernel."""
    _, steps, work = _steps_and_work(path)
    busy = sum(e - s for s, e in _merged([(w["ts"], w["ts"] + w["dur"]) for w in work]))
    compute = _merged([(w["ts"], w["ts"] + w["dur"]) for w in work
                       if w["cat"] == "kernel" and not w["name"].startswith("nccl")])
    exposed = sum(w["dur"] - sum(max(0.0, min(w["ts"] + w["dur"], b) - max(w["ts"], a)) for a, b in compute)
                  for w in work if w["name"].startswith("nccl"))
    n = len(steps)
    return {"wall": sum(s["dur"] for s in steps) / n / 1e3, "busy": busy / n / 1e3, "exposed": exposed / n / 1e3,
            "steps": n}


def _collectives(path: Path) -> dict[str, list[tuple[float, float]]]:
    """NCCL kernels of the measured steps by kind, as (start on the job's clock, duration) in µs."""
    doc, _, work = _steps_and_work(path)
    out: dict[str, list[tuple[float, float]]] = {}
    for w in work:
        if w["name"].startswith("nccl"):
            kind = next(k for k in ("AllGather", "ReduceScatter", "AllReduce") if k in w["name"])
            out.setdefault(kind, []).append((w["ts"] + doc["baseTimeNanoseconds"] / 1e3, w["dur"]))
    return {k: sorted(v) for k, v in out.items()}


@pytest.fixture(scope="module")
def answer() -> list[str]:
    inputs = report_inputs([FSDP2 / "rank0.json.gz", FSDP2 / "rank1.json.gz"])
    bds, tables = inputs.breakdowns, inputs.ranks
    return answer_markdown(report_findings(bds, tables))


def _figures(line: str) -> list[float]:
    return [float(x) for x in re.findall(r"(\d+\.\d+)", line)]


def test_the_answer_opens_with_the_rank_that_paces_the_job(answer) -> None:
    c0, c1 = _collectives(FSDP2 / "rank0.json.gz"), _collectives(FSDP2 / "rank1.json.gz")
    pairs = [(a, b) for kind in c0 for a, b in zip(c0[kind], c1[kind])]
    assert len(pairs) == 80
    last_one = sum(b[0] >= a[0] for a, b in pairs) / len(pairs)
    assert last_one == 1.0  # rank 1 starts every collective last
    one = _hand(FSDP2 / "rank1.json.gz")
    compute = min(one["busy"], one["wall"]) - one["exposed"]
    line = answer[2]
    assert line.startswith(f"- rank 1 paces the job: it arrives last at {last_one:.0%} of the collectives")
    assert f"its GPU computes {compute / one['wall']:.1%} of its step ({compute:.1f} of {one['wall']:.1f} ms)" in line
    assert compute / one["wall"] < HOST_BOUND and "its host, not its GPU, sets the pace" in line


def test_waiting_against_transfer_matches_hand_count(answer) -> None:
    c0, c1 = _collectives(FSDP2 / "rank0.json.gz"), _collectives(FSDP2 / "rank1.json.gz")
    steps = _hand(FSDP2 / "rank0.json.gz")["steps"]
    waiting = transfer = 0.0
    for kind in c0:
        for (s0, d0), (s1, _) in zip(c0[kind], c1[kind]):
            w = max(0.0, min(max(s0, s1) - s0, d0))  # rank 0's part before rank 1's collective starts
            waiting, transfer = waiting + w, transfer + d0 - w
    line = answer[3]
    assert line.startswith(f"- rank 0 waits {waiting / steps / 1e3:.1f} ms per step in collectives for rank 1, "
                           f"against {transfer / steps / 1e3:.1f} ms of transfer")


def test_each_rank_verdict_matches_hand_count(answer) -> None:
    zero, one = _hand(FSDP2 / "rank0.json.gz"), _hand(FSDP2 / "rank1.json.gz")
    assert answer[4].startswith("- rank 0: waits for rank 1")  # most of its step is waiting, not its host
    assert _figures(answer[4])[1] == pytest.approx(100 * (min(zero["busy"], zero["wall"]) - zero["exposed"])
                                                   / zero["wall"], abs=0.05)
    expected = bound_text("rank 1", one["wall"], one["busy"], one["exposed"])
    assert answer[5] == f"- {expected} (see: Per phase)"
    assert expected.startswith("rank 1: host-bound")


def test_no_straggler_where_the_ranks_steps_agree(answer) -> None:
    walls = [_hand(FSDP2 / f"rank{r}.json.gz")["wall"] for r in (0, 1)]
    line = next(x for x in answer if "straggler" in x)
    # the ranks wait for each other, so their steps last alike: the paced job has no straggler
    assert max(walls) / min(walls) < 1.05
    assert line.startswith("- no straggler") and f"slowest rank 1, {max(walls):.1f} ms" in line


def test_the_answer_is_short_and_states_its_rules(answer) -> None:
    bullets = [x for x in answer if x.startswith("- ")]
    assert 4 <= len(bullets) <= MAX_FINDINGS
    assert answer[-2].startswith("Rules: host-bound where the GPU computes")


def test_report_opens_with_the_answer(tmp_path) -> None:
    from harness.report import main

    assert main([str(FSDP2 / "rank0.json.gz"), str(FSDP2 / "rank1.json.gz"), "--out", str(tmp_path), "--no-plot"]) == 0
    lines = (tmp_path / "kernels.md").read_text().splitlines()
    assert lines[2] == "## The answer" and lines[4].startswith("- rank 1 paces the job")
    assert "The answer" in (tmp_path / "report.html").read_text()


@pytest.mark.parametrize(("share", "verdict"), [(HOST_BOUND - 0.001, "host-bound"), (HOST_BOUND, "partly host-bound"),
                                                (GPU_BOUND - 0.001, "partly host-bound"), (GPU_BOUND, "GPU-bound")])
def test_bound_thresholds(share: float, verdict: str) -> None:
    assert bound(share) == verdict


def test_bound_text_takes_exposed_communication_out_of_the_busy_time() -> None:
    # 100 ms step, GPU busy 90 ms of which 30 ms communication nobody computes under: 60% computing
    assert bound_text("x", 100.0, 90.0, 30.0) == ("x: partly host-bound: its GPU computes 60.0% of the step (60.0 of "
                                                  "100.0 ms); 30.0% of the step is exposed communication")


def test_answer_keeps_to_its_line_budget() -> None:
    lines = answer_markdown([Finding("t", f"finding {i}") for i in range(MAX_FINDINGS + 3)])
    bullets = [x for x in lines if x.startswith("- ")]
    assert len(bullets) == MAX_FINDINGS + 1 and bullets[-1] == "- ... 3 more findings in the sections below"


def test_compare_report_opens_with_the_fastest_backend_and_its_margin() -> None:
    from harness.reports.compare import compare_markdown

    summary = json.loads((Path(__file__).parent / "data" / "compare_cpu" / "summary.json").read_text())
    steps = {b: (r["phases"].get("fused_step") or r["phases"]["step"]) for b, r in summary["runs"].items()}
    best = min(steps, key=lambda b: steps[b]["median_ms"])
    lines = compare_markdown(summary).splitlines()
    assert lines[2] == "## The answer"
    assert lines[4].startswith(f"- {best} is fastest: {steps[best]['median_ms']:.1f} ms per step; ")
    parts = {part.split(" than ")[1].split(",")[0]: part for part in lines[4].split(" (see: ")[0].split("; ")[1:]}
    for b, p in steps.items():
        if b != best:
            ratio = p["median_ms"] / steps[best]["median_ms"]
            apart = p["p10_ms"] > steps[best]["p90_ms"]  # the slower one's p10 above the fastest's p90
            assert parts[b].startswith(f"{ratio:.2f}x faster")
            assert parts[b].endswith("beyond the noise" if apart else "inside the noise (the p10-p90 ranges overlap)")
    assert any(x.startswith("- parity: ") for x in lines[4:12])


def test_sweep_answer_from_the_stored_cpu_sweep(tmp_path) -> None:
    """JAX's step against torch's per cell, counted here from cells.jsonl, and the failed cells."""
    import shutil
    import statistics

    from harness.common.answer import answer_markdown
    from harness.reports.sweep_answer import RULES, sweep_findings
    from harness.sweeps.analysis import analyze

    data_dir = Path(__file__).parent / "data" / "sweep"
    shutil.copytree(data_dir, tmp_path / "s")
    cells = [json.loads(line) for line in (data_dir / "cells.jsonl").read_text().splitlines()]
    steps = {}
    for c in cells:
        if c["status"] == "ok" and c["cell"]["warmup"] is None:
            p = c["result"]["phases"]
            steps[(c["cell"]["model"], c["cell"]["ctx"], c["cell"]["dtype"], c["cell"]["backend"])] = \
                (p.get("fused_step") or p["step"])["median_ms"] if c["cell"]["backend"] == "jax" else p["step"]["median_ms"]
    lines = answer_markdown(sweep_findings(analyze(str(tmp_path / "s"))), RULES)
    for dtype in ("fp32", "bf16"):
        ratios = [steps[(m, t, d, "jax")] / steps[(m, t, d, "torch")] for (m, t, d, b) in steps
                  if b == "torch" and d == dtype and (m, t, d, "jax") in steps]
        line = next(x for x in lines if x.startswith(f"- {dtype}: jax's step takes"))
        assert line.startswith(f"- {dtype}: jax's step takes {statistics.median(ratios):.2f}x (median; "
                               f"{min(ratios):.2f}-{max(ratios):.2f}x over {len(ratios)} cells) the time of torch's")
        assert f"jax is faster in {sum(r < 1 for r in ratios)} of {len(ratios)}" in line
    failed = {c["key"] for c in cells if c["status"] not in ("ok", "not run") and c["cell"]["warmup"] is None}
    line = next(x for x in lines if "OOM" in x or "failed" in x)
    assert all(key in line for key in failed)


def test_scaling_answer_names_each_groups_efficiency_and_the_best(tmp_path, capsys) -> None:
    from harness import scaling

    def doc(backend: str, n: int, step_ms: float) -> dict:
        o = {"backend": backend, "model": "large", "ctx": 1024, "batch": 4, "dtype": "bf16", "attention": "naive",
             "device": "cuda", "parallel": "ddp", "data_parallel": n}
        d = {"status": "ok", "options": o, "phases": {"step": {"median_ms": step_ms}}}
        if n > 1:
            d["data_parallel"] = {"n": n, "step_ms": step_ms}
        return d

    runs = [doc("torch", 1, 100.0), doc("torch", 4, 125.0), doc("jax", 1, 80.0), doc("jax", 4, 84.0)]
    paths = []
    for i, d in enumerate(runs):
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(json.dumps(d))
    assert scaling.main([str(p) for p in paths]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "## The answer"
    # weak scaling: the step at N = 4 against the one-device step, the per-device batch fixed
    assert lines[2] == f"- best: jax (replicated), {80 / 84:.1%} at N = 4 (see: the table)"
    assert any(x.startswith(f"- torch (DDP, 25 MB buckets) at N = 4: {100 / 125:.1%} efficiency on the synchronized "
                            "step (125.0 ms)") for x in lines)


JAX_LOOP = Path(__file__).parent / "data" / "user_ranks" / "jax"


def test_a_two_device_jax_loop_is_host_bound_by_hand_count() -> None:
    """A user's data-parallel Flax loop over two GPUs, traced by jax.profiler: its trace-viewer
    export reads as one process driving two devices (not as two ranks: the export numbers
    host threads by the OS's ids), like the XSpace it mirrors; the answer's verdict is the
    step's mean wall time against each device's busy time less its NCCL time not under a
    compute kernel, averaged over the devices, counted here from the JSON."""
    path = JAX_LOOP / "jax_loop.trace.json.gz"
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    steps = [e for e in events if e.get("ph") == "X" and e["name"] == "train"]
    assert sorted(int(e["args"]["step_num"]) for e in steps) == [2, 3, 4, 5]
    busy, exposed, lead = [], [], []
    for pid, name in processes.items():
        if not name.startswith("/device:GPU:"):
            continue
        mine = [e for e in events if e.get("pid") == pid and e.get("ph") == "X"
                and any(s["ts"] <= e["ts"] < s["ts"] + s["dur"] for s in steps)]
        # from each step's start to the device's first kernel in it
        lead.append(sum(min(e["ts"] for e in mine if s["ts"] <= e["ts"] < s["ts"] + s["dur"]) - s["ts"]
                        for s in steps) / len(steps))
        busy.append(sum(b - a for a, b in _merged([(e["ts"], e["ts"] + e["dur"]) for e in mine])) / len(steps))
        compute = _merged([(e["ts"], e["ts"] + e["dur"]) for e in mine if not e["name"].startswith("nccl")])
        exposed.append(sum(e["dur"] - sum(max(0.0, min(e["ts"] + e["dur"], b) - max(e["ts"], a)) for a, b in compute)
                           for e in mine if e["name"].startswith("nccl")) / len(steps))
    assert len(busy) == 2
    wall = sum(s["dur"] for s in steps) / len(steps) / 1e3
    expected = bound_text("jax", wall, sum(busy) / 2e3, sum(exposed) / 2e3, sum(lead) / 2e3)
    assert expected.startswith("jax: host-bound") and "for the host to launch the step's first kernel" in expected
    for source in (path, JAX_LOOP / "jax_loop.xplane.pb.gz"):
        inputs = report_inputs([source])
        bds, tables = inputs.breakdowns, inputs.ranks
        assert tables == [] and bds[0].phases["train"].devices == 2
        lines = answer_markdown(report_findings(bds, tables))
        assert lines[2] == f"- {expected} (see: Per phase)"
