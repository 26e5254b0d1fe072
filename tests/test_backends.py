"""The backend registry: a backend added from outside runs through `harness.run` and
`harness.compare` with no other file changed, its subprocesses included."""

from __future__ import annotations

import json

import pytest

from harness import backends
from harness.backends import Backend
from harness.backends.torch.session import TorchSession, init_model
from harness.common.errors import UsageError

EXACT = {"logits": 1e-6, "loss": 1e-6, "grad": 1e-6, "param": 1e-6, "update": 1e-6}


class ToySession(TorchSession):
    """Eager torch in float32 under another name: the same program as the reference, so
    parity must find it equal to rounding."""


def _toy_session(opts, config, tokens) -> ToySession:
    return ToySession(config, tokens, device=opts.device, dtype=opts.dtype, seed=opts.seed,
                      weights=init_model(config, opts.seed), optimizer=opts.optimizer)


TOY = Backend(name="toy", make_session=_toy_session, precision={"fp32": "toy: eager torch in float32"},
              attention=("naive",), memory_note="toy: no peak memory on CPU", tolerances={"fp32": EXACT},
              unavailable=lambda device: "toy runs on the CPU only; use --device cpu" if device != "cpu" else None)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.delenv(backends.PLUGINS_ENV, raising=False)
    backends.register(TOY, source=f"{__file__}:TOY")
    yield TOY
    backends.unregister(TOY.name)


def test_registered_backend_is_listed_and_exported(toy):
    import os

    assert backends.names()[-1] == "toy" and backends.get("toy") is TOY
    assert "toy" in backends.compared() and "toy" not in backends.defaults()
    assert os.environ[backends.PLUGINS_ENV] == f"{__file__}:TOY"
    assert backends.backend_attention("toy", "naive") == "naive"
    assert "is not a kernel of --backend toy" in backends.attention_problem("toy", "fused")
    with pytest.raises(UsageError, match="--backend toy runs on the CPU only"):
        backends.choose_backends(["toy"], (), "cuda", "run")


def test_unregistered_backend_is_gone(toy):
    import os

    backends.unregister("toy")
    assert "toy" not in backends.names() and backends.PLUGINS_ENV not in os.environ
    with pytest.raises(ValueError, match="unknown backend 'toy'"):
        backends.get("toy")
    backends.register(TOY, source=f"{__file__}:TOY")  # for the fixture's teardown


def test_toy_backend_runs_and_compares_end_to_end(toy, tmp_path):
    """`harness.compare --backend torch,toy` runs the toy's `harness.run` in a subprocess,
    which finds the toy through the environment, checks parity against eager torch and
    reports it: the toy is eager torch, so its first loss is torch's to the bit."""
    common = ["--model", "tiny", "--ctx", "16", "--batch", "2", "--device", "cpu", "--warmup", "1", "--steps", "2"]

    from harness import compare

    assert compare.main(["--backend", "torch,toy", *common, "--out", str(tmp_path / "results")]) == 0
    folder = next((tmp_path / "results").iterdir())
    summary = json.loads((folder / "summary.json").read_text())
    runs = summary["runs"]
    assert list(runs) == ["torch", "toy"] and summary["reference"] == "torch"
    doc = runs["toy"]  # the toy's harness.run document, as its subprocess wrote it
    assert doc["status"] == "ok" and doc["precision"] == "toy: eager torch in float32"
    assert doc["options"]["backend"] == "toy" and doc["memory_note"] == TOY.memory_note
    assert list(doc["phases"]) == ["forward", "backward", "optimizer", "step"]  # no fused step
    assert runs["toy"]["loss"]["first"] == runs["torch"]["loss"]["first"]
    parity = summary["parity"]
    assert parity["ok"] and parity["tolerances"] == {"toy": EXACT}
    assert {r["backend"] for r in parity["rows"]} == {"toy"}
    assert "**toy**" in (folder / "report.md").read_text()


def test_every_session_class_has_the_protocol_s_methods():
    """The built-in sessions implement `Session` (checked by name and signature's
    keyword-only `grad` of forward, which the timer passes)."""
    import inspect

    from harness.backends.jax.session import JaxSession
    from harness.backends.session import Session
    from harness.backends.torch.session import TorchCompileSession

    wanted = {name for name, _ in inspect.getmembers(Session, inspect.isfunction) if not name.startswith("_")}
    assert {"forward", "backward", "optimizer_step", "fused_step", "plain_step", "sync", "params"} <= wanted
    for cls in (TorchSession, TorchCompileSession, JaxSession, ToySession):
        assert wanted <= {name for name, _ in inspect.getmembers(cls, inspect.isfunction)}, cls
        assert "grad" in inspect.signature(cls.forward).parameters, cls


def test_wrap_options_reach_only_the_backends_that_take_them() -> None:
    """A comparison's DDP/FSDP2 options go into the torch runs' command lines and not into
    JAX's (Backend.wrap_options); the defaults are left out of every command line."""
    from harness.timing.spec import Comparison, RunSpec, run_argv

    run = RunSpec(backend="torch", model="tiny", ctx=16, data_parallel=2, parallel="fsdp", ddp_bucket_mb=50.0,
                  grad_comm="bf16", fsdp_reshard_after_forward=False)
    c = Comparison(run=run, backends=("torch", "jax"))
    torch_argv, jax_argv = run_argv(c.run_spec("torch")), run_argv(c.run_spec("jax"))
    assert torch_argv[-8:] == ["--parallel", "fsdp", "--ddp-bucket-mb", "50", "--grad-comm", "bf16",
                               "--fsdp-reshard-after-forward", "false"]
    assert jax_argv[-4:] == ["--data-parallel", "2", "--parallel", "fsdp"]
    assert c.run_spec("jax").fsdp_reshard_after_forward and c.run_spec("jax").ddp_bucket_mb is None
    assert "--parallel" not in run_argv(RunSpec(backend="torch", model="tiny", ctx=16, ddp_bucket_mb=50.0))


def test_parallel_strategies_are_asked_of_the_record() -> None:
    from harness.backends.parallel import parallel_label, parallel_problem

    assert parallel_label("torch-compile", "fsdp") == "FSDP2" and parallel_label("jax", "zero1", short=True) == \
        "sharded optimizer state"
    assert parallel_problem("jax", "ddp", ddp_static_graph=True).startswith("--ddp-static-graph is an option of "
                                                                            "torch's DDP/FSDP2")
    assert parallel_problem("torch", "zero1") == ("--parallel zero1 (sharded optimizer state) is jax's; for torch use "
                                                  "--parallel ddp (DDP) or fsdp (FSDP2)")
    assert parallel_problem("jax", "zero1") is None and parallel_problem("torch", "ddp", 25.0) is None
    # CUDA graphs do not follow FSDP2's all-gathers: refused with the fix rather than run many times slower
    refused = parallel_problem("torch-compile-cg", "fsdp")
    assert refused.startswith("--parallel fsdp: torch-compile-cg's CUDA graphs do not") and "--backend torch-compile" in refused
    assert parallel_problem("torch-compile", "fsdp") is None and parallel_problem("torch-compile-cg", "ddp") is None


def test_a_plugin_may_build_on_a_builtin_record(tmp_path, monkeypatch):
    """A plugin file that derives its record from a built-in one while it is imported (the
    registry loads the built-ins first) loads; one whose entry names nothing is one line."""
    import dataclasses

    plugin = tmp_path / "derived.py"
    plugin.write_text("import dataclasses\nfrom harness import backends\n"
                      "DERIVED = dataclasses.replace(backends.get('torch'), name='derived', default=False)\n")
    monkeypatch.setattr(backends, "_loaded", False)
    monkeypatch.setattr(backends, "_records", {})
    monkeypatch.setenv(backends.PLUGINS_ENV, f"{plugin}:DERIVED")
    derived = backends.get("derived")
    assert derived == dataclasses.replace(backends.get("torch"), name="derived", default=False)
    monkeypatch.setattr(backends, "_loaded", False)
    monkeypatch.setenv(backends.PLUGINS_ENV, f"{plugin}:NOTHING")
    for _ in range(2):  # the failed load is not taken for a finished one
        with pytest.raises(UsageError, match="has no attribute 'NOTHING'"):
            backends.names()


@pytest.mark.parametrize("tool", ["diff", "scaling", "run", "report"])
def test_a_bad_plugin_entry_ends_each_tool_in_one_line(tool: str, monkeypatch, capsys) -> None:
    """Every tool that reads backends by name (run through --backend, diff and scaling through
    the documents they read, report through the profiles' file names) refuses a plugin entry that cannot load, before any work, in one
    line with exit code 2."""
    import importlib

    monkeypatch.setattr(backends, "_loaded", False)
    monkeypatch.setattr(backends, "_records", {})
    monkeypatch.setenv(backends.PLUGINS_ENV, "no_such_module_here:THING")
    main = importlib.import_module(f"harness.{tool}").main
    with pytest.raises(SystemExit) as exit_:
        main(["nothing.json"] if tool != "run" else ["--backend", "torch"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "HARNESS_BACKEND_PLUGINS entry 'no_such_module_here:THING'" in err[0]


def test_a_failure_line_names_the_error_inside_a_nested_traceback() -> None:
    """XLA reports a failed Python callback (a custom partitioner's) as a message whose first
    line only opens a traceback: the failure line takes the traceback's exception instead."""
    from argparse import Namespace

    from harness.common.errors import describe_failure

    nested = RuntimeError(
        "INTERNAL: custom_partitioner: Traceback (most recent call last):\n"
        '  File "x.py", line 1, in <module>\n'
        "ValueError: Mismatch in result shapes. [f32[2,4]] vs [f32[2,2]]\n"
        "Suspected Python Code Location:\n  model.py:61:15 [RMSNorm.__call__]")
    size = Namespace(model="large", batch=4, ctx=1024, dtype="bf16")
    assert describe_failure(nested, "backward", size) == (
        "RuntimeError in backward (model large, batch 4, ctx 1024, bf16): INTERNAL: custom_partitioner: "
        "ValueError: Mismatch in result shapes. [f32[2,4]] vs [f32[2,2]]")
    plain = RuntimeError("INTERNAL: something broke\nmore detail")
    assert describe_failure(plain, "forward", size).endswith("): INTERNAL: something broke")
