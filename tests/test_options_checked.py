"""Options that cannot do what they say are refused before any work: checked against each
other and against this machine, one line naming the option and the fix, exit code 2, no
result left behind. Each case plants its input; the work itself (`compare.compare`,
`run.run`) is replaced by a stand-in that fails the test if it is reached."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

from harness import compare, parity, report, run
from harness.backends import jax as jax_backend
from harness.config import get_config
from harness.sweeps.step_memory import predict

DATA = Path(__file__).parent / "data"
FALLBACK = DATA / "torch_fallback" / "torch_tiny_fallback.json.gz"  # 2 warm-up steps, 3 measured
GIB = 2**30


class Reached(BaseException):
    """The work started: the options were not refused before it (past a tool's `except Exception`)."""


@pytest.fixture(autouse=True)
def no_work(monkeypatch):
    def reached(*args, **kwargs):
        raise Reached

    monkeypatch.setattr(compare, "compare", reached)
    monkeypatch.setattr(run, "run", reached)
    monkeypatch.setattr(parity, "check_parity", reached)
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    monkeypatch.setenv("HARNESS_XLA_FLAGS_CHECKED", "")  # no verdict yet; removed again after the test


def _refused(module, argv: list[str], capsys, *needles: str) -> None:
    """`module.main(argv)` exits 2 before any work with one line holding every needle."""
    try:
        code = module.main(argv)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert all(n in lines[0] for n in needles), err


COMPARE = ["--model", "tiny", "--ctx", "16", "--device", "cpu"]
RUN = ["--model", "tiny", "--ctx", "16", "--device", "cpu"]


# -- --layer-ranges: refused for a backend without them (the README says so) -------------------
def test_layer_ranges_refuse_a_named_backend_without_them(tmp_path, capsys) -> None:
    """compare printed one line and ran torch-compile without layer ranges anyway."""
    out = tmp_path / "results"
    _refused(compare, [*COMPARE, "--backend", "torch,torch-compile", "--layer-ranges", "--out", str(out)], capsys,
             "--layer-ranges with --backend torch-compile:", "use --backend torch or jax")
    assert not out.exists()


def test_layer_ranges_leave_out_a_default_backend_without_them(capsys) -> None:
    args = compare.build_parser().parse_args(["--ctx", "16", "--layer-ranges"])
    assert compare.default_backends(args) == ["torch", "jax"]
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"compare: skipping torch-compile: --layer-ranges with --backend torch-compile: "
                   f"{compare.backends.get('torch-compile').layer_ranges_problem}"]


# -- --attention pallas: a folder labelled pallas must hold the Pallas kernel -----------------
def test_an_attention_no_chosen_backend_runs_is_refused(tmp_path, capsys) -> None:
    """`--attention pallas --backend torch` named the folder "pallas" though only SDPA ran."""
    out = tmp_path / "results"
    _refused(compare, [*COMPARE, "--attention", "pallas", "--backend", "torch", "--out", str(out)], capsys,
             "--attention pallas is no kernel of --backend torch (they would run fused in its place)",
             "include jax in --backend", "or ask for --attention fused")
    assert not out.exists()
    with pytest.raises(Reached):  # with jax beside it, torch's SDPA stands in as documented
        compare.main([*COMPARE, "--attention", "pallas", "--backend", "torch,jax", "--out", str(out)])


# -- --annotate-attention needs naive attention's three steps ---------------------------------
@pytest.mark.parametrize("module, argv", [(compare, COMPARE), (run, [*RUN, "--backend", "torch"])],
                         ids=["compare", "run"])
def test_annotate_attention_with_a_fused_kernel_is_refused(module, argv, tmp_path, capsys) -> None:
    """It was found in the child, after the other backends' work, leaving a failed folder."""
    out = tmp_path / ("results" if module is compare else "r.json")
    _refused(module, [*argv, "--annotate-attention", "--attention", "fused", "--out", str(out)], capsys,
             "--annotate-attention", "--attention fused runs one fused kernel", "add --attention naive")
    assert not out.exists()


# -- --timeline-steps beyond the measured steps --------------------------------------------
def test_compare_timeline_steps_beyond_its_steps_are_refused(tmp_path, capsys) -> None:
    out = tmp_path / "results"
    _refused(compare, [*COMPARE, "--steps", "3", "--profile", "--timeline", "--timeline-steps", "1,3-4",
                       "--out", str(out)], capsys,
             "--timeline-steps 3,4: --steps 3 measures steps 0-2", "pick indices below 3")
    assert not out.exists()


def test_report_timeline_steps_beyond_the_profiles_are_refused(tmp_path, capsys) -> None:
    """report wrote an empty timeline and exited 0; now nothing is written. The fixture holds
    3 `step` ranges after its 2 `warmup` ones: measured steps 0-2."""
    from harness.trace.sources.kineto import load_torch_trace

    assert [r.name for r in load_torch_trace(FALLBACK).ranges].count("step") == 3
    out = tmp_path / "kernels"
    _refused(report, [str(FALLBACK), "--out", str(out), "--no-plot", "--timeline", "--timeline-steps", "3"], capsys,
             "--timeline-steps 3: the profiles hold measured steps 0-2", "pick indices below 3")
    assert not out.exists()


# -- a batch beyond this machine's memory -------------------------------------------------
def _largest_batch(memory: int, mode: str = "train") -> int:
    """The largest tiny ctx-16 fp32 batch whose predicted peak fits `memory`, counted up
    from the memory model's own prediction (independent of the search in fit_problem)."""
    config = get_config("tiny")
    batch = 0
    while predict(config, batch + 1, 16, "fp32")["peaks"]["step"] <= memory:
        batch += 1
    return batch


@pytest.mark.parametrize("module, argv", [(compare, COMPARE), (run, [*RUN, "--backend", "torch"]),
                                          (parity, [*RUN, "--backend", "jax"])],
                         ids=["compare", "run", "parity"])
def test_a_batch_beyond_the_machine_memory_is_refused(module, argv, tmp_path, capsys, monkeypatch) -> None:
    """A huge --batch ran into MemoryError after 10 s and left a failed result; the memory
    model's prediction refuses it first, naming the largest batch that fits (planted: a
    machine of 1 GiB)."""
    from harness import memory_model

    monkeypatch.setattr(memory_model, "machine_memory", lambda device: (GIB, "a planted 1.0 GiB"), raising=False)
    fits = _largest_batch(GIB)
    assert 100 < fits < 2000
    out = tmp_path / ("results" if module is compare else "r.json")
    _refused(module, [*argv, "--batch", str(fits + 1), "--out", str(out)], capsys,
             f"--batch {fits + 1}: the step would need about", "more than a planted 1.0 GiB",
             f"use --batch {fits} or less")
    assert not out.exists()
    with pytest.raises(Reached):  # the largest batch that fits runs
        module.main([*argv, "--batch", str(fits), "--out", str(out)])


def test_the_torch_graph_guards_torch_runs_on_a_gpu_and_every_run_on_the_cpu(monkeypatch) -> None:
    """The prediction is of torch's autograd graph: a JAX-only run on a GPU is left to XLA's own
    plan (a run out of memory says so itself); one with a torch backend, and any on the CPU, is
    refused past the planted 1 GiB."""
    from harness import memory_model

    monkeypatch.setattr(memory_model, "machine_memory", lambda device: (GIB, "a planted 1.0 GiB"), raising=False)
    batch = _largest_batch(GIB) + 1
    problem = functools.partial(memory_model.fit_problem, "tiny", 16, batch, "fp32", "naive", "train")
    assert problem("cuda", backend_names=["jax"]) is None
    for device, names in (("cuda", ["jax", "torch-compile"]), ("cuda", ()), ("cpu", ["jax"])):
        assert problem(device, backend_names=names).startswith(f"--batch {batch}: the step would need about")


def test_a_huge_batch_is_refused_against_the_real_host_memory(tmp_path, capsys) -> None:
    out = tmp_path / "r.json"
    _refused(run, [*RUN, "--backend", "torch", "--batch", "100000000", "--out", str(out)], capsys,
             "--batch 100000000:", "of host RAM", "or less")
    assert not out.exists()


def test_the_gpu_memory_comes_from_nvidia_smi_without_starting_cuda(monkeypatch) -> None:
    from harness import memory_model
    from harness.common import results

    monkeypatch.setattr(results, "nvidia_smi_all", lambda: [{"gpu_name": "NVIDIA H100 80GB HBM3",
                                                             "gpu_memory": "81559 MiB"}])
    assert memory_model.machine_memory("cuda") == (81559 * 2**20, "the GPU's 79.6 GiB")
    monkeypatch.setattr(results, "nvidia_smi_all", lambda: [{"gpu_memory": "143771 MiB"}, {"gpu_memory": "81559 MiB"}])
    assert memory_model.machine_memory("cuda") == (81559 * 2**20, "the smallest of the 2 GPUs' 79.6 GiB")
    monkeypatch.setattr(results, "nvidia_smi_all", lambda: [])  # no nvidia-smi: no verdict, nothing refused
    assert memory_model.machine_memory("cuda") is None
    assert memory_model.fit_problem("tiny", 16, 10**8, "fp32", "naive", "train", "cuda") is None


def test_a_sweep_cell_runs_where_the_model_predicts_no_fit(capsys) -> None:
    """A sweep records a cell's OOM as a finding: its cells pass --allow-oom."""
    from harness.runs.sweep import cell_command
    from harness.sweeps.records import Cell

    opts = {"attention": "naive", "warmup": 1, "steps": 2, "device": "cpu", "mode": "train", "optimizer": "fused",
            "batch": 100000000}
    argv = cell_command(Cell("tiny", 16, "torch", "fp32"), opts, "o.json")
    assert "--allow-oom" in argv
    with pytest.raises(Reached):
        run.main(argv[argv.index("--allow-oom"):])


# -- XLA_FLAGS that JAX cannot start with ----------------------------------------------------
def test_junk_xla_flags_are_refused_before_any_backend_starts(tmp_path, capsys, monkeypatch) -> None:
    """The JAX child died on an unknown flag after torch's runs, leaving a failed folder."""
    monkeypatch.setenv("XLA_FLAGS", "--xla_no_such_flag=1")
    out = tmp_path / "results"
    _refused(compare, [*COMPARE, "--backend", "torch,jax", "--out", str(out)], capsys,
             "XLA_FLAGS='--xla_no_such_flag=1'", "Unknown flag", "--xla_no_such_flag", "unset XLA_FLAGS")
    assert not out.exists()


def test_good_xla_flags_are_probed_once(monkeypatch) -> None:
    """A flag XLA knows passes, and the children of the tool inherit the verdict."""
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    assert jax_backend.xla_flags_problem() is None
    assert os.environ[jax_backend.XLA_FLAGS_CHECKED] == "--xla_force_host_platform_device_count=2"
    monkeypatch.setattr(jax_backend.subprocess, "run", lambda *a, **k: pytest.fail("probed twice"))
    assert jax_backend.xla_flags_problem() is None
