"""harness.run and harness.compare end to end on the CPU, and their failure paths; a profiled
compare and the out-of-memory runs are in tests/test_compare_profile_and_oom.py."""

import json
import os
import subprocess
import sys
import tempfile
import threading
import types
from pathlib import Path

import pytest

from harness import compare
from harness.cli.dialect import parse_args
from harness.runs import compare as compare_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli(module: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=1800,
                          env=env)


@pytest.fixture(scope="module")
def compare_run(tmp_path_factory):
    """One comparison of every default backend, shared by the tests of its folder, its
    parity and its compile cache (where JAX caches every compile, however short)."""
    out = tmp_path_factory.mktemp("results")
    env = dict(os.environ, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    proc = cli("harness.compare", "--model", "tiny", "--ctx", "32", "--batch", "2", "--warmup", "1", "--steps", "3",
               "--device", "cpu", "--out", str(out), "--compile-cache", str(out / "cache"), env=env)
    return proc, out


def test_compare_writes_a_complete_result_folder(compare_run):
    proc, out = compare_run
    assert proc.returncode == 0, proc.stderr[-2000:]
    folder = out / "tiny-ctx32-fp32-cpu"
    assert sorted(os.listdir(folder)) == ["phases.png", "report.html", "report.md", "summary.json"]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["schema"] == "harness.compare/1" and summary["ok"] is True
    assert summary["parity"]["ok"] is True and summary["parity"]["batch"] == 2
    for backend in ("torch", "jax"):
        r = summary["runs"][backend]
        assert r["status"] == "ok" and r["env"]["git_commit"]
        # the child's command names its result by file name: the compare's work folder is gone after the run
        assert r["env"]["command"].endswith(f"--out {backend}.json") and tempfile.gettempdir() not in r["env"]["command"]
        ph = r["phases"]
        for name in ("forward", "backward", "optimizer", "step"):
            assert ph[name]["n"] == 3 and ph[name]["min_ms"] > 0
            assert ph[name]["min_ms"] <= ph[name]["median_ms"] <= ph[name]["max_ms"]
        # the phases happen inside the step: per measured step, their sum is at most the step
        for i in range(3):
            assert sum(ph[p]["times_ms"][i] for p in ("forward", "backward", "optimizer")) <= ph["step"]["times_ms"][i]
        assert ph["backward"]["flops"] == 2 * ph["forward"]["flops"]
        assert r["overhead"]["ratio"] > 0
    assert "fused_step" in summary["runs"]["jax"]["phases"]
    # both backends start from the same weights and batch: same first loss
    assert summary["runs"]["torch"]["loss"]["first"] == pytest.approx(summary["runs"]["jax"]["loss"]["first"], rel=1e-4)
    report = (folder / "report.md").read_text()
    assert "| forward |" in report and "## Parity" in report and "PASS" in report
    assert "jax/torch" in proc.stdout and "parity: PASS" in proc.stdout


def test_compare_runs_torch_compile_beside_eager_torch_and_jax(compare_run, inductor):
    """By default compare runs the compiled backend too (where Inductor builds on this CPU):
    a column of its own, parity against eager torch inside the compiled bound, and its
    compiled graphs left in the named compile cache."""
    from harness.backends.torch import COMPILE_TOLERANCES

    proc, out = compare_run
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((out / "tiny-ctx32-fp32-cpu" / "summary.json").read_text())
    assert list(summary["runs"]) == ["torch", "torch-compile", "jax"] and summary["reference"] == "torch"
    compiled, eager = summary["runs"]["torch-compile"], summary["runs"]["torch"]
    assert compiled["status"] == "ok" and compiled["options"]["optimizer"] == "fused"
    assert "Inductor" in compiled["precision"] and "fused_step" not in compiled["phases"]
    # the same weights, batch and program: the same first loss to float32 reordering
    assert compiled["loss"]["first"] == pytest.approx(eager["loss"]["first"], rel=1e-6)
    step = next(row for row in summary["table"] if row["phase"] == "step")
    assert step["ratios"]["torch-compile"] == pytest.approx(
        compiled["phases"]["step"]["median_ms"] / eager["phases"]["step"]["median_ms"])
    rows = [r for r in summary["parity"]["rows"] if r["backend"] == "torch-compile"]
    assert len(rows) == 2 + 3 * (3 + 2 * 9)  # logits, loss, and per parameter: grad, param, update
    assert all(r["ok"] and r["rel_err"] <= COMPILE_TOLERANCES["fp32"][r["quantity"]] for r in rows)
    assert summary["parity"]["tolerances"]["torch-compile"] == COMPILE_TOLERANCES["fp32"]
    assert "torch-compile/torch" in proc.stdout
    report = (out / "tiny-ctx32-fp32-cpu" / "report.md").read_text()
    assert "torch-compile ms (median, p10-p90)" in report and "**torch-compile**" in report
    assert os.listdir(out / "cache" / "inductor" / "fxgraph")  # Inductor's FX graph cache went to --compile-cache


def test_compare_default_skips_what_cannot_run_here(monkeypatch, capsys):
    """Without a C++ compiler the default drops torch-compile with one line saying why;
    named explicitly, a backend that cannot run is bad input."""
    from harness import backends
    from harness.backends import torch as torch_family
    from harness.common.errors import UsageError

    monkeypatch.setattr(torch_family, "inductor_cpu_compiler", lambda: None)
    assert backends.choose_backends(None, backends.defaults(), "cpu", "compare") == ["torch", "jax"]
    err = capsys.readouterr().err.strip()
    assert err == ("compare: skipping torch-compile on CPU needs a C++ compiler for Inductor's kernels and found "
                   "none (install g++ or set $CXX)")
    with pytest.raises(UsageError, match="--backend torch-compile on CPU needs a C\\+\\+ compiler"):
        backends.choose_backends(["torch-compile"], backends.defaults(), "cpu", "compare")


@pytest.mark.parametrize("tool, args, message", [
    ("harness.compare", ["--backend", "torch,torch-compile-cg"],
     "error: --backend torch-compile-cg replays CUDA graphs and needs --device cuda; on CPU use torch-compile"),
    ("harness.run", ["--backend", "torch-compile-cg"],
     "error: --backend torch-compile-cg replays CUDA graphs and needs --device cuda; on CPU use torch-compile"),
    ("harness.compare", ["--backend", "torch-inductor"],
     "error: argument --backend: unknown backend 'torch-inductor'; choose one of torch, torch-compile, "
     "torch-compile-cg, jax (see python -m harness.compare --help)"),
    ("harness.run", ["--backend", "torch-compile", "--optimizer", "adam"],
     "error: argument --optimizer: unknown optimizer 'adam'; choose one of foreach, foreach-compiled, fused, loop "
     "(see python -m harness.run --help)"),
    ("harness.run", ["--backend", "torch-compile", "--annotate-attention"],
     "error: --annotate-attention with --backend torch-compile: it synchronizes inside attention, which a "
     "compiled graph cannot hold; use --backend torch or jax"),
])
def test_compiled_backends_bad_input_is_one_line(tool, args, message):
    proc = cli(tool, "--model", "tiny", "--ctx", "8", "--device", "cpu", *args)
    assert proc.returncode == 2 and proc.stderr.strip() == message


def test_compare_accepts_the_compiled_backends():
    args = parse_args(compare.build_parser(), ["--model", "tiny", "--ctx", "8", "--backend",
                                               "torch-compile,torch-compile-cg,jax", "--optimizer", "loop"])
    assert args.backend == ["torch-compile", "torch-compile-cg", "jax"] and args.optimizer == "loop"
    assert parse_args(compare.build_parser(), ["--model", "tiny", "--ctx", "8"]).backend is None  # resolved in main


@pytest.mark.parametrize("args, message", [
    (["--model", "gigantic", "--ctx", "8"], "error: argument --model: unknown model 'gigantic'; choose one of tiny, mini, small"),
    (["--model", "tiny", "--ctx", "8", "--dtype", "fp8"], "error: argument --dtype: unknown dtype 'fp8'; choose one of fp32, tf32, bf16"),
    (["--model", "tiny", "--ctx", "8", "--attention", "flash"],
     "error: argument --attention: unknown attention 'flash'; choose one of naive"),
    (["--model", "tiny", "--ctx", "0"], "error: argument --ctx: expected a positive integer, got '0'"),
])
def test_bad_input_is_one_line_naming_the_choices(args, message):
    proc = cli("harness.run", "--backend", "torch", *args)
    err = proc.stderr.strip()
    assert proc.returncode == 2 and err.startswith(message) and len(err.splitlines()) == 1
    proc = cli("harness.run", "--backend", "mxnet", "--model", "tiny", "--ctx", "8")
    assert proc.returncode == 2 and "unknown backend 'mxnet'; choose one of torch, torch-compile, torch-compile-cg, jax" \
        in proc.stderr


def test_result_folder_is_named_after_the_device():
    """A successful run's device names the folder; when every run failed
    (no device reported) the requested device does, so a failed GPU run is
    not filed under -cpu."""
    def parse(*argv):
        return compare.comparison_from_args(parse_args(compare.build_parser(), list(argv)), ["torch"], None)

    args = parse("--model", "large", "--ctx", "1024", "--dtype", "bf16", "--attention", "pallas", "--device", "cuda")
    assert compare_lib.result_dir_name(args, "NVIDIA H100 80GB HBM3") == "large-ctx1024-bf16-pallas-h100-80gb-hbm3"
    assert compare_lib.result_dir_name(args, None) == "large-ctx1024-bf16-pallas-cuda"
    args = parse("--model", "tiny", "--ctx", "16", "--device", "cpu")
    assert compare_lib.result_dir_name(args, None) == "tiny-ctx16-fp32-cpu"
    assert compare_lib.result_dir_name(args, "cpu") == "tiny-ctx16-fp32-cpu"


def test_jax_processes_share_the_named_compile_cache(compare_run):
    """--compile-cache reaches the JAX subprocesses: the run's executables land there
    (every compile is cached here, however short) and stay after the comparison."""
    proc, out = compare_run
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = os.listdir(out / "cache")
    assert any(n.startswith("jit__fused_flat_step-") for n in names), names  # one device: the one-array step


def test_interrupted_write_leaves_no_half_written_folder(tmp_path, monkeypatch):
    import harness.reports.compare

    def boom(summary, path):
        raise KeyboardInterrupt

    monkeypatch.setattr(harness.reports.compare, "plot_phases", boom)
    with pytest.raises(KeyboardInterrupt):
        compare_lib.write_results({"options": {}}, str(tmp_path), "x-ctx1-fp32-cpu")
    assert os.listdir(tmp_path) == []


def test_a_report_that_fails_to_render_keeps_the_runs(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("a rendering defect")

    monkeypatch.setattr(compare_lib, "write_results", broken)
    monkeypatch.setattr(compare_lib, "result_dir_name", lambda c, device: "x-ctx1-fp32-cpu")
    summary = {"device": "cpu", "runs": {"torch": {"status": "ok", "phases": {}}, "jax": {"status": "ok"}}}
    c = types.SimpleNamespace(out=str(tmp_path), overwrite=False)
    with pytest.raises(compare_lib.NotRendered, match=r"\(ValueError: a rendering defect\); the documents are "
                                                       r"kept in .*x-ctx1-fp32-cpu-unrendered; `--render"):
        compare_lib.write_or_keep(summary, c, None)
    kept = tmp_path / "x-ctx1-fp32-cpu-unrendered"
    assert sorted(os.listdir(kept)) == ["jax.json", "summary.json", "torch.json"]
    assert json.loads((kept / "summary.json").read_text()) == summary
    assert json.loads((kept / "torch.json").read_text()) == summary["runs"]["torch"]


@pytest.mark.parametrize("backend", ["torch", "torch-compile", "jax"])
def test_nsys_compare_wraps_each_backend_in_nsys_profile(tmp_path, monkeypatch, backend):
    """compare --nsys runs harness.run under `nsys profile` (JAX with XLA's NVTX domain
    excluded); a fake nsys stands in, the command it is given is what is checked."""
    fake = tmp_path / "nsys"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    seen = []
    monkeypatch.setattr(compare_lib, "_stream", lambda program, env: (seen.append(program), (1, ""))[1])
    args = parse_args(compare.build_parser(), ["--model", "tiny", "--ctx", "8", "--nsys", "--nsys-bin", str(fake),
                                               "--compile-cache", str(tmp_path / "cache")])
    spec = compare.comparison_from_args(args, [backend], "nsys")
    doc, profile = compare_lib.run_backend(backend, spec, str(tmp_path))
    assert doc["status"] == "error" and profile is None
    (program,) = seen
    assert program[:2] == [str(fake), "profile"] and "harness.run" in program
    assert program[program.index("--backend") + 1] == backend
    assert ("--nvtx-domain-exclude=TSL" in program) == (backend == "jax")


def test_parity_halves_the_batch_when_its_process_reports_out_of_memory(tmp_path, monkeypatch):
    """harness.parity writes status "oom" to its --out; compare retries at half the batch,
    and a process that failed otherwise ends the retries with its message."""
    from harness.timing.spec import Comparison, RunSpec

    batches = []

    def fake_parity(program, env):
        batch = int(program[program.index("--batch") + 1])
        batches.append(batch)
        out = program[program.index("--out") + 1]
        doc = {"ok": True, "rows": []} if batch == 2 else {"ok": None, "status": "oom", "error": "oom", "batch": batch}
        Path(out).write_text(json.dumps(doc))
        return (0 if batch == 2 else 2), ""

    monkeypatch.setattr(compare_lib, "_stream", fake_parity)
    spec = Comparison(run=RunSpec(backend="torch", model="tiny", ctx=16, batch=8), backends=("torch", "jax"),
                      compile_cache=str(tmp_path / "cache"))
    doc = compare_lib.run_parity(spec, str(tmp_path), ["jax"])
    assert batches == [8, 4, 2] and doc["ok"] and doc["reduced_batch"]

    def failing(program, env):
        Path(program[program.index("--out") + 1]).write_text(json.dumps(
            {"ok": None, "status": "error", "error": "ValueError in parity", "batch": 8}))
        return 2, ""

    monkeypatch.setattr(compare_lib, "_stream", failing)
    assert compare_lib.run_parity(spec, str(tmp_path), ["jax"]) == {"ok": None, "error": "ValueError in parity",
                                                                    "batch": 8}


def test_a_second_compare_into_the_same_folder_is_refused_while_the_first_runs(tmp_path, monkeypatch, capsys):
    """Two compares of one result folder at once: the second refuses in one line, before any
    work, instead of both saying "wrote" and the first result going; once the first is done,
    the folder is free again and no lock file is left."""
    with open(os.path.join(ROOT, "tests", "data", "compare_cpu", "summary.json")) as f:
        summary = json.load(f)
    running, done, calls = threading.Event(), threading.Event(), []

    def first(comparison):  # stands for the comparison's work
        calls.append(comparison)
        if len(calls) == 1:
            running.set()
            done.wait(30)
        return summary, str(tmp_path / "tiny-ctx16-fp32-cpu")

    monkeypatch.setattr(compare, "compare", first)
    argv = ["--model", "tiny", "--ctx", "16", "--device", "cpu", "--backend", "torch", "--out", str(tmp_path)]
    codes = []
    thread = threading.Thread(target=lambda: codes.append(compare.main(argv)))
    thread.start()
    assert running.wait(30)
    try:
        capsys.readouterr()
        assert compare.main([*argv, "--overwrite"]) == 2
    finally:
        done.set()
        thread.join(30)
    err = capsys.readouterr().err
    assert len(calls) == 1 and codes == [0]
    assert err == (f"error: --out {tmp_path}: another compare (process {os.getpid()}) is writing tiny-ctx16-fp32-cpu "
                   "there now; wait for it to finish, or pass another --out to run both\n")
    assert os.listdir(tmp_path) == []
    assert compare.main(argv) == 0 and len(calls) == 2


def test_a_signal_during_the_kernel_breakdown_keeps_the_runs_and_parity(tmp_path, monkeypatch):
    """SIGTERM (or Ctrl-C) after the runs and parity finished, while the profiles are being
    read: the result folder is written all the same, without the breakdown, and the
    interruption says where it is (exit 130 in the entry point)."""
    from harness import Terminated

    with open(os.path.join(ROOT, "tests", "data", "compare_cpu", "summary.json")) as f:
        done = json.load(f)
    profile = tmp_path / "torch.json.gz"
    profile.write_bytes(b"")
    monkeypatch.setattr(compare_lib, "run_backend", lambda b, c, work: (done["runs"][b], str(profile)))
    monkeypatch.setattr(compare_lib, "parity_or_skip", lambda c, runs, work, backends: done["parity"])

    def breakdown(profiles, work, nsys_bin):
        raise Terminated("SIGTERM")

    monkeypatch.setattr(compare_lib, "kernel_breakdown", breakdown)
    args = parse_args(compare.build_parser(), ["--model", "tiny", "--ctx", "16", "--device", "cpu", "--backend",
                                               "torch,jax", "--profile", "--out", str(tmp_path / "out")])
    spec = compare.comparison_from_args(args, ["torch", "jax"], "framework")
    with pytest.raises(compare_lib.Interrupted) as stopped:
        compare_lib.compare(spec)
    folder = tmp_path / "out" / "tiny-ctx16-fp32-cpu-profiled"
    assert str(stopped.value) == ("interrupted: stopped by SIGTERM during the kernel breakdown; the runs and parity "
                                  f"are kept in {folder}")
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["runs"] == {b: done["runs"][b] for b in ("torch", "jax")} and summary["parity"] == done["parity"]
    assert summary["kernel_breakdown_error"] == "stopped by SIGTERM during the kernel breakdown"
    assert "stopped by SIGTERM during the kernel breakdown" in (folder / "report.md").read_text()
