"""harness.diff of data-parallel runs on a synthetic pair: communication is one of the parts
(zero on a side without it), and the sentences give each side's exposed share."""

from __future__ import annotations

import pytest

from harness.diffs.decompose import COMMUNICATION, HOST, diff_runs
from harness.diffs.inputs import KernelRow, PhaseProfile, Run
from harness.reports.diff import diff_markdown, sentences
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


def _profile(label: str, kernels: list, steps: int = 2):
    """Ranges of `steps` steps 100 ns apart (forward [0,40), backward [40,90), optimizer
    [90,100) of each) after a warm-up range; `kernels` (name, start, end, device, stream)
    repeat in every step."""
    from harness.trace.profile import Kernel, Profile, Range

    ranges, ks = [Range("warmup", -50, -1)], [Kernel(GEMM, -40, -30, 0, 7)]
    for s in range(steps):
        t = 100 * s
        ranges += [Range("step", t, t + 100), Range("forward", t, t + 40), Range("backward", t + 40, t + 90),
                   Range("optimizer", t + 90, t + 100)]
        ks += [Kernel(name, t + a, t + b, dev, stream) for name, a, b, dev, stream in kernels]
    return Profile(label, label, "nsys", ks, ranges)


def test_data_parallel_diff_is_per_device_and_has_no_negative_part() -> None:
    """Torch rank 0 with NCCL on its own stream beside the backward's GEMMs, against JAX's
    one process over two devices: host time is range minus the union of the kernels, the
    communication part its exposed share, and JAX's figures the mean of its two devices."""
    from harness.diffs.inputs import _phase
    from harness.trace.analyses.breakdown import breakdown

    ew = "vectorized_elementwise_kernel"
    torch_prof = _profile("torch", [(GEMM, 0, 30, 0, 7), (GEMM, 40, 80, 0, 7), (NCCL, 50, 88, 0, 13),
                                    (ew, 90, 95, 0, 7)])
    jax_prof = _profile("jax", [(k, a, b, dev, 7) for dev in (0, 1) for k, a, b in
                                ((GEMM, 0, 30), (GEMM, 40, 70), (NCCL, 70, 80), (ew, 90, 95))])
    runs = []
    for prof, backend in ((torch_prof, "torch"), (jax_prof, "jax")):
        phases = {name: _phase(p) for name, p in breakdown(prof).phases.items()}
        doc = {"options": {"model": "tiny", "ctx": 16, "batch": 2, "dtype": "bf16", "mode": "train",
                           "backend": backend}, "env": {"device": "NVIDIA H200"}, "data_parallel": {"n": 2}}
        runs.append(Run(backend, backend, doc, phases))
    back = runs[1].phases["backward"]
    assert (back.devices, back.gpu_ns, back.busy_ns) == (2, 40, 40)  # per device, not 80 summed over two
    d = diff_runs(*runs)
    parts = {p.name: p for p in d.phase("backward").parts}
    # torch: range 50, kernels 40 + 38 = 78 but their union [40,88) 48: host 2 (the kernel sum gave -28);
    # NCCL [50,88) under the GEMM [40,80) for 30 of its 38 ns: 8 exposed. JAX: union 40 of 50: host 10.
    assert (parts[HOST].a_ms, parts[HOST].b_ms) == (2e-6, 10e-6)
    # float64 ns / 1e6 after a subtraction: equal to ~1e-16 relative
    assert (parts[COMMUNICATION].a_ms, parts[COMMUNICATION].b_ms) == pytest.approx((8e-6, 10e-6), rel=1e-12)
    assert all(p.a_ms >= 0 and p.b_ms >= 0 for ph in d.phases for p in ph.parts)
    assert ("per device: torch: rank 0's own profile (one of 2 ranks); jax: the mean of its 2 device timelines "
            "(one process drives them all)") in d.notes


def test_real_data_parallel_profiles_diff_without_a_negative_part() -> None:
    """Torch rank 0's own profile against JAX's one process over two GPUs (the real
    fixtures of tests/data/dp_small_bf16): the host part is range time with no kernel
    running on the device, so neither side goes below zero, and JAX's figures are the
    mean of its two device timelines."""
    from pathlib import Path

    from harness.diffs.inputs import resolve_one

    data = Path(__file__).parent / "data" / "dp_small_bf16"
    a, b = resolve_one(data / "torch_dp2.rank0.sqlite.gz"), resolve_one(data / "jax_dp2.sqlite.gz")
    assert b.doc["data_parallel"]["n"] == 2 and all(p.devices == 2 for p in b.phases.values())
    d = diff_runs(a, b, force=True)
    parts = [p for ph in d.phases for p in ph.parts]
    assert parts and all(p.a_ms >= 0 and p.b_ms >= 0 for p in parts)
    assert any("jax_dp2: the mean of its 2 device timelines" in n for n in d.notes)


def test_exposed_communication_per_compared_step() -> None:
    """With per-step figures the sentence sets the compared kinds of step against each other
    (JAX's fused step against torch's step), as shares of each step."""
    fused = {"fused_step": {"devices": 2, "step_ms": 10.0, "communication_ms": 1.0, "exposed_ms": 0.2,
                            "exposed_max_ms": 0.3, "exposed_share_of_step": 0.02},
             "step": {"devices": 2, "step_ms": 20.0, "communication_ms": 1.0, "exposed_ms": 1.0,
                      "exposed_max_ms": 1.0, "exposed_share_of_step": 0.05}}
    a = _run("ddp", 2, [12.0, 12.0, 12.0], 7.0, 4.0, {**_overlap(12.0, 3.0), "per_step": {
        "step": {"devices": 2, "step_ms": 12.0, "communication_ms": 4.0, "exposed_ms": 3.0, "exposed_max_ms": 3.5,
                 "exposed_share_of_step": 0.25}}})
    b = _run("jax", 2, [10.0, 10.0, 10.0], 7.0, 1.0, {**_overlap(4.0, 2.8), "per_step": fused})
    b.doc["phases"]["fused_step"] = {"times_ms": [10.0, 10.0, 10.0]}
    b.phases["fused_step"] = b.phases["step"]
    d = diff_runs(a, b)
    assert (d.step.a_phase, d.step.b_phase) == ("step", "fused_step")
    (line,) = [s for s in sentences(d) if s.startswith("Exposed")]
    assert line.startswith("Exposed communication per step: B's fused_step waits 0.200 ms for its communication "
                           "(2.0% of the step) against A's step 3.000 ms (25.0%), the mean over devices; of the "
                           "communication kernel time over all measured steps 30.0% is exposed against 75.0%")


def test_a_data_parallel_folder_from_before_per_device_figures_is_refused(tmp_path, capsys) -> None:
    """The committed DDP-4 folder, its JAX breakdown written the way the harness wrote it
    before the per-device figures (no `devices`, the kernels of its 4 devices summed: a
    forward GEMM of 38.4 ms against the 9.6 ms of one device): one line with the fix, not
    a per-device note beside summed figures. The folder as committed diffs per device."""
    import json
    import shutil
    from pathlib import Path

    from harness import diff as diff_cli

    src = Path(__file__).parent.parent / "results" / "several-gpus" / "large-ctx1024-bf16-fused-ddp4-h200-profiled"
    shutil.copy(src / "summary.json", tmp_path)
    bds = json.loads((src / "kernels.json").read_text())
    jax = next(bd for bd in bds if bd["label"] == "jax")
    for p in jax["phases"].values():
        n = p.pop("devices")
        for key in ("busy_ns_per_step", "hidden_communication_ns_per_step"):
            p.pop(key)
        for key in ("gpu_ns_per_step", "kernels_per_step", "copies_per_step", "gpu_ns_median"):
            p[key] *= n
        p["categories"] = {c: v * n for c, v in p["categories"].items()}
        for k in p["kernels"]:
            k["ns_per_step"] *= n
            k["calls_per_step"] *= n
    assert jax["phases"]["forward"]["categories"]["gemm"] / 1e6 == pytest.approx(38.43, abs=0.01)
    (tmp_path / "kernels.json").write_text(json.dumps(bds))
    assert diff_cli.main([f"{tmp_path}:torch-compile-cg", f"{tmp_path}:jax"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {tmp_path}:jax: its kernels.json predates the per-device figures: the kernels of its 4 "
                   "devices are summed, not per device; diff its profile (kept by harness.compare --keep-profiles) "
                   "or run the compare again"]
    assert diff_cli.main([f"{src}:torch-compile-cg", f"{src}:jax"]) == 0
    out = capsys.readouterr().out
    assert "| GEMM | 10.502 | 9.608 | -0.894 | 253 | 145 |" in out
