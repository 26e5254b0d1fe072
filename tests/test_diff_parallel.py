"""harness.diff of data-parallel runs on a synthetic pair: communication is one of the parts
(zero on a side without it), and the sentences give each side's exposed share."""

from __future__ import annotations

from harness.diffs.decompose import COMMUNICATION, HOST, diff_runs
from harness.diffs.inputs import KernelRow, PhaseProfile, Run
from harness.diffs.render import diff_markdown, sentences
from harness.trace.kernels import Category, classify

NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"


def _run(label: str, n: int, step_ms: list[float], gemm_ms: float, comm_ms: float,
         overlap: dict | None = None) -> Run:
    """A run whose step is `gemm_ms` of GEMM and `comm_ms` of NCCL per step, the rest host."""
    rows = [KernelRow(GEMM, classify(GEMM).value, 10, gemm_ms * 1e6, None)]
    categories = {Category.GEMM.value: gemm_ms * 1e6}
    if comm_ms:
        rows.append(KernelRow(NCCL, classify(NCCL).value, 2, comm_ms * 1e6, None))
        categories[Category.COMMUNICATION.value] = comm_ms * 1e6
    mean = sum(step_ms) / len(step_ms)
    phase = PhaseProfile(mean * 1e6, (gemm_ms + comm_ms) * 1e6, len(rows), categories, rows)
    doc = {"options": {"model": "tiny", "ctx": 16, "batch": 2, "dtype": "bf16", "mode": "train"},
           "env": {"device": "NVIDIA H200"}, "phases": {"step": {"times_ms": step_ms}}}
    if n > 1:
        doc["data_parallel"] = {"n": n}
    return Run(label, label, doc, {"step": phase}, overlap=overlap)


def _overlap(comm: float, hidden: float) -> dict:
    return {"communication_ms": comm, "hidden_ms": hidden, "exposed_ms": comm - hidden, "hidden_share": hidden / comm}


def test_communication_part_and_exposed_share() -> None:
    a = _run("jax", 2, [10.0, 10.0, 10.0], 7.0, 1.0, _overlap(3.0, 2.4))
    b = _run("ddp", 2, [12.0, 12.0, 12.0], 7.0, 4.0, _overlap(12.0, 3.0))
    d = diff_runs(a, b)
    step = d.phase("step")
    parts = {p.name: p for p in step.parts}
    assert (parts[COMMUNICATION].a_ms, parts[COMMUNICATION].b_ms) == (1.0, 4.0)
    assert parts[COMMUNICATION].movers[0].name == NCCL
    assert parts[HOST].delta_ms == (12 - 11) - (10 - 8)  # host: range - GPU time, B - A
    assert abs(step.residual_ms) < 1e-9  # the profile's mean is the timer's median here
    assert d.overlap["a"]["exposed_share"] == 1 - 2.4 / 3 and d.overlap["b"]["exposed_share"] == 0.75
    text = sentences(d)
    assert "Communication kernels: B spends 3.000 ms more per step (1.000 -> 4.000 ms in 2 -> 2 kernels)." in text
    assert ("Exposed communication: 75.0% of B's communication kernel time is not hidden under compute against "
            "A's 20.0% (0.600 of 3.000 ms -> 9.000 of 12.000 ms, summed over each profile's measured steps).") in text
    assert "| communication | 1.000 | 4.000 | +3.000 | 2 | 2 |" in diff_markdown(d)


def test_one_device_side_shows_zero_communication_and_no_share() -> None:
    a = _run("one", 1, [9.0, 9.0], 7.0, 0.0)
    b = _run("ddp", 2, [12.0, 12.0], 7.0, 4.0, _overlap(8.0, 2.0))
    d = diff_runs(a, b)
    comm = next(p for p in d.phase("step").parts if p.name == COMMUNICATION)
    assert (comm.a_ms, comm.b_ms, comm.a_kernels) == (0.0, 4.0, 0.0)
    assert d.overlap == {} and not any(s.startswith("Exposed") for s in sentences(d))
    assert any("A runs on 1 device(s), B on 2" in n for n in d.notes)
    # two one-device runs without communication keep their parts as before: no empty group
    d = diff_runs(a, _run("one-b", 1, [9.5, 9.5], 7.5, 0.0))
    assert COMMUNICATION not in {p.name for p in d.phase("step").parts}


def test_compare_folder_overlap_reaches_the_run(tmp_path) -> None:
    import json

    from harness.diffs.inputs import resolve_one

    doc = {"status": "ok", "options": {"batch": 2}, "phases": {}, "data_parallel": {"n": 2}}
    (tmp_path / "summary.json").write_text(json.dumps({"schema": "harness.compare/1", "runs": {"torch": doc, "jax": doc},
                                                       "overlap": {"torch": _overlap(4.0, 1.0)}}))
    assert resolve_one(f"{tmp_path}:torch").overlap == _overlap(4.0, 1.0)
    assert resolve_one(f"{tmp_path}:jax").overlap is None
