"""Data-parallel runs on CPU: torch over 2 gloo processes, JAX over 2 host devices.

Parity: the 2-device step against the 1-device step on the same weights and the same
global batch. The 2-device gradient is the mean of two per-shard means (gloo sums them,
DDP/FSDP divide by 2; XLA inserts an all-reduce) where the 1-device one is a single mean
over the batch: the same numbers summed in another order, so float32 rounding is all that
differs. Loss: rtol 1e-6. Parameters after one AdamW step: atol 1e-5, since the first
AdamW update is lr * g / (|g| + eps), which turns a rounding difference of a gradient
component near eps into an update difference up to lr-sized; measured ~3e-6."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import on_two_host_devices

from harness.backends.parallel import SAFE_ENV
from harness.runs import distributed
from harness.runs.distributed import parity_step
from harness.timing.spec import RunSpec

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--model", "tiny", "--ctx", "16", "--batch", "2", "--warmup", "1", "--steps", "2", "--device", "cpu"]
HOST_2 = "--xla_force_host_platform_device_count=2"
# XLA merges sharded parameters' all-gathers up to 256 MiB, reduce-scatters up to 16 MiB,
# and schedules them to hide under compute
MERGED = {"xla_gpu_all_gather_combine_threshold_bytes": 268435456,
          "xla_gpu_reduce_scatter_combine_threshold_bytes": 16777216,
          "xla_gpu_enable_latency_hiding_scheduler": True}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SAFE_ENV and k != "XLA_FLAGS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return {**env, **extra}


def _harness(args: list[str], env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    """A tool in a subprocess; the timeout only ends a hung run (a busy machine is slow, not wrong)."""
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _one_device_step(opts: RunSpec) -> tuple[float, dict, float]:
    """Loss and parameters after one step of the one-device run on the global batch, and
    how far that step moved the parameters (largest change)."""
    from harness.config import get_config
    from harness.timing.runner import make_session

    single = dataclasses.replace(opts, batch=opts.batch * opts.data_parallel, data_parallel=1)
    session = make_session(single, get_config(opts.model))
    before = session.params()
    loss = session.forward()
    session.backward()
    session.optimizer_step()
    after = session.params()
    return float(loss), after, max(float(np.max(np.abs(after[k] - before[k]))) for k in after)


def _assert_parity(one: tuple[float, dict, float], two: tuple[float, dict]) -> None:
    (loss1, p1, moved), (loss2, p2) = one, two
    assert p1.keys() == p2.keys()
    np.testing.assert_allclose(loss2, loss1, rtol=1e-6)
    for name in p1:
        np.testing.assert_allclose(p2[name], p1[name], rtol=0, atol=1e-5, err_msg=name)
    assert moved > 1e-4  # the step changed the weights by far more than the tolerance


# Stands in for nsys: writes the report it is asked for and runs the program (its first
# argument after `profile` that is no flag), so the test sees each rank wrapped on its own.
FAKE_NSYS = """#!{python}
import os, sys
args = sys.argv[2:]
at = next(i for i, a in enumerate(args) if not a.startswith("-"))
out = next(a.split("=", 1)[1] for a in args[:at] if a.startswith("--output="))
with open(out + ".nsys-rep", "w") as f:
    f.write(" ".join(args[at:]))
os.execv(args[at], args[at:])
"""


def test_torch_two_gloo_ranks_end_to_end(tmp_path: Path) -> None:
    out, nsys = tmp_path / "dp.json", tmp_path / "nsys"
    nsys.write_text(FAKE_NSYS.format(python=sys.executable))
    nsys.chmod(0o755)
    proc = _harness(["harness.run", "--backend", "torch", *TINY, "--data-parallel", "2", "--quiet",
                     "--out", str(out), "--nsys-ranks", str(tmp_path / "torch"), "--nsys-bin", str(nsys)],
                    _env(TORCH_SYMM_MEM_DISABLE_MULTICAST="1", XFPROF_SENTINEL="kept"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    for rank in (0, 1):  # one report per rank, each around that rank's worker
        assert (tmp_path / f"torch.rank{rank}.nsys-rep").read_text().endswith(f"spec.json {rank}")
    doc = json.loads(out.read_text())
    dp = doc["data_parallel"]
    assert (dp["n"], dp["parallel"], dp["global_batch"]) == (2, "ddp", 4)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    # every rank ran the NVLink-multicast switches: set by the launcher or inherited
    assert dp["environment"] == SAFE_ENV
    medians = [r["phases"]["step"]["median_ms"] for r in doc["ranks"]]
    assert dp["step_ms"] == max(medians)
    assert dp["spread"]["step"]["straggler"] == pytest.approx(max(medians) / min(medians))
    assert dp["tokens_per_s"] == pytest.approx(2 * 2 * 16 / (max(medians) / 1e3))
    assert "straggler" in proc.stdout and "global batch 4" in proc.stdout
    # both ranks trained on different rows of the global batch
    assert doc["ranks"][0]["loss"]["first"] != doc["ranks"][1]["loss"]["first"]
    for rank in doc["ranks"]:
        _assert_per_device(rank["phases"], devices=2)


def _assert_per_device(phases: dict, devices: int) -> None:
    """TFLOP/s of every phase: one device's work (the FLOPs of --batch 2 rows, not of the
    global 4) over the phase's median; tokens/s: the whole job's rows."""
    from harness.config import get_config
    from harness.timing.flops import phase_flops

    work = phase_flops(get_config("tiny"), 2, 16)
    for name, p in phases.items():
        assert p["flops"] == work[name], name
        if work[name]:
            assert p["tflops"] == pytest.approx(work[name] / (p["median_ms"] / 1e3) / 1e12, rel=1e-12), name
        else:  # the optimizer's update counts no FLOPs: no rate, not a rate of zero
            assert p["tflops"] is None, name
        assert p["tokens_per_s"] == pytest.approx(devices * 2 * 16 / (p["median_ms"] / 1e3), rel=1e-12), name


def test_worker_environment_keeps_every_variable(monkeypatch) -> None:
    monkeypatch.setenv("XFPROF_SENTINEL", "kept")
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    monkeypatch.delenv("NVSHMEM_DISABLE_NVLS", raising=False)
    env = distributed.worker_env(2, 1, 12345)
    assert env["XFPROF_SENTINEL"] == "kept"
    assert {k: env[k] for k in SAFE_ENV} == SAFE_ENV
    assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_PORT"]) == ("1", "2", "12345")
    assert set(os.environ) <= set(env)


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_torch_two_ranks_match_one_device(parallel: str) -> None:
    opts = RunSpec(backend="torch", model="tiny", ctx=16, batch=2, data_parallel=2, parallel=parallel)
    _assert_parity(_one_device_step(opts), parity_step(opts))


JAX_SCRIPT = """
import json, numpy as np
import jax
from harness.runs.distributed import parity_step
from harness.timing import runner
from harness.timing.spec import RunSpec
from tests.test_data_parallel import _one_device_step
# The session parity_step makes, with its arrays' layouts before its first step: it runs two
# more steps below rather than a second session compiling the same programs again
made = []
make_session = runner.make_session
def keep_session(*args, **kwargs):
    s = make_session(*args, **kwargs)
    made.append((s, [x.sharding for x in jax.tree.leaves((s.state, s.opt_state))]))
    return s
runner.make_session = keep_session
out = {}
opts = RunSpec(backend="jax", model="tiny", ctx=16, batch=2, data_parallel=2)
l1, p1, moved = _one_device_step(opts)
for parallel in ("ddp", "fsdp", "zero1"):
    made.clear()
    l2, p2 = parity_step(RunSpec(**{**opts.__dict__, "parallel": parallel}))
    out[parallel] = {"loss": [l1, l2], "max_abs": max(float(np.max(np.abs(p1[k] - p2[k]))) for k in p1),
                     "moved": moved, "same_keys": p1.keys() == p2.keys()}
    # two more split steps on parity_step's session: over its three, the update compiled
    # once, handing back the layouts it was given
    (s, before), = made
    for _ in range(2):
        s.forward(); s.backward(); s.optimizer_step()
    out[parallel]["update_compiles"] = s._update._cache_size()
    out[parallel]["compiler_options"] = s.compiler_options
    out[parallel]["layouts_kept"] = before == [x.sharding for x in jax.tree.leaves((s.state, s.opt_state))]
    out[parallel]["moments_split"] = any(len(x.sharding.device_set) == 2 and not x.sharding.is_fully_replicated
                                         for x in jax.tree.leaves(s.opt_state))
print(json.dumps(out))
"""


def test_jax_two_host_devices_end_to_end_and_parity(tmp_path: Path) -> None:
    env = _env(XLA_FLAGS=HOST_2, JAX_PLATFORMS="cpu")
    out = tmp_path / "jax.json"
    proc = _harness(["harness.run", "--backend", "jax", *TINY, "--data-parallel", "2", "--parallel", "fsdp", "--quiet",
                     "--out", str(out)], env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["data_parallel"]["label"].startswith("sharded parameters, collectives merged (")
    assert doc["env"]["compiler_options"] == MERGED  # what the jitted programs were compiled with
    assert doc["data_parallel"]["global_batch"] == 4
    assert doc["data_parallel"]["step_ms"] == doc["phases"]["step"]["median_ms"]
    assert doc["phases"]["step"]["tokens_per_s"] == pytest.approx(4 * 16 / (doc["phases"]["step"]["median_ms"] / 1e3))
    _assert_per_device(doc["phases"], devices=2)  # one device's work, not the sum over two
    assert doc["figures"]["tflops"] == "per device"
    proc = on_two_host_devices(JAX_SCRIPT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for parallel, r in json.loads(proc.stdout.splitlines()[-1]).items():
        assert r["same_keys"], parallel
        np.testing.assert_allclose(r["loss"][1], r["loss"][0], rtol=1e-6, err_msg=parallel)
        assert r["max_abs"] < 1e-5 < 1e-4 < r["moved"], parallel
        assert r["update_compiles"] == 1 and r["layouts_kept"], parallel
        assert r["moments_split"] == (parallel != "ddp"), parallel  # zero1 and fsdp split the AdamW state
        # only sharded parameters have per-parameter collectives for XLA to merge
        assert r["compiler_options"] == (MERGED if parallel == "fsdp" else {}), parallel


SPLIT = r"""
import json, re, jax, jax.numpy as jnp, numpy as np
from harness.backends.jax.session import JaxSession
from harness.config import get_config
config = get_config("tiny", attention="pallas")
tokens = np.random.default_rng(0).integers(0, config.vocab_size, (4, 17))
s = JaxSession(config, tokens, device="cpu", dtype="fp32", seed=0, data_parallel=2, parallel="ddp")
loss, _ = s._fwd(s.state, s.inputs, s.targets)
text = s._fwd.lower(s.state, s.inputs, s.targets).compile().as_text()
one = JaxSession(config, tokens, device="cpu", dtype="fp32", seed=0)
print(json.dumps({"gathers": len(re.findall(r"all-gather\(", text)),
                  "loss": [float(loss), float(one._fwd(one.state, one.inputs, one.targets)[0])]}))
"""


def test_jax_pallas_attention_under_data_parallel_runs_on_each_device_s_batch() -> None:
    """JAX's --attention pallas on two devices: the session's programs run with its mesh set,
    so the attention kernels run per device on their share of the batch (XLA, which cannot
    split a kernel call, would gather q, k and v); nothing in the forward is gathered, and the
    loss is the one-device loss (4 sequences' token losses averaged in another order)."""
    proc = on_two_host_devices(SPLIT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got["gathers"] == 0
    np.testing.assert_allclose(got["loss"][0], got["loss"][1], rtol=4 * 16 * 2 ** -23)


def test_jax_without_host_devices_is_one_line() -> None:
    proc = _harness(["harness.run", "--backend", "jax", *TINY, "--data-parallel", "2"], _env(JAX_PLATFORMS="cpu"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert "--data-parallel 2" in lines[0] and "XLA_FLAGS=--xla_force_host_platform_device_count=2" in lines[0]


def test_a_setting_given_in_xla_flags_is_not_overridden(monkeypatch) -> None:
    """Options handed to the compiler override XLA_FLAGS, so the session leaves out each
    setting the user gave there, and keeps the others."""
    from harness.backends.jax.session import compiler_options

    monkeypatch.delenv("XLA_FLAGS", raising=False)
    assert compiler_options("fsdp", 4, "cpu") == MERGED
    assert compiler_options("ddp", 4, "cpu") == compiler_options("fsdp", 1, "cpu") == {}
    # on a GPU the dot merger is off too, on one device and on several
    assert compiler_options("ddp", 1, "gpu") == {"xla_gpu_dot_merger_threshold_mb": 0}
    assert compiler_options("fsdp", 4, "gpu") == MERGED | {"xla_gpu_dot_merger_threshold_mb": 0}
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_dot_merger_threshold_mb=32")
    assert compiler_options("ddp", 1, "gpu") == {}
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_latency_hiding_scheduler=true "
                                    "--xla_gpu_reduce_scatter_combine_threshold_bytes=33554432")
    assert compiler_options("fsdp", 4, "cpu") == {"xla_gpu_all_gather_combine_threshold_bytes": 256 << 20}
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_latency_hiding_scheduler=false")
    assert "xla_gpu_enable_latency_hiding_scheduler" not in compiler_options("fsdp", 4, "cpu")
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_all_gather_combine_threshold_bytes_x=1")  # another flag's name
    assert compiler_options("fsdp", 4, "cpu") == MERGED


def test_the_gpu_options_are_ones_this_xla_compiles_with() -> None:
    """The GPU options take effect only on a GPU, but XLA checks their names on any backend:
    a program compiles with them here, and not with a name XLA does not have."""
    import jax
    import jax.numpy as jnp

    from harness.backends.jax.session import GPU_COMPILER_OPTIONS, SHARDED_COMPILER_OPTIONS

    x = jnp.ones((4, 8))
    for options in (GPU_COMPILER_OPTIONS, SHARDED_COMPILER_OPTIONS):
        assert float(jax.jit(lambda a: (a @ a.T).sum(), compiler_options=options)(x)) == 4 * 4 * 8
    with pytest.raises(Exception, match="xla_gpu_dot_merger_threshold_megabytes"):
        jax.jit(lambda a: a.sum(), compiler_options={"xla_gpu_dot_merger_threshold_megabytes": 0})(x)


def test_rank_frees_its_cycles_before_it_destroys_the_group(monkeypatch) -> None:
    """An FSDP2 model lives in reference cycles and holds the process group: a rank frees
    such cycles before destroying the group, not at the interpreter's exit."""
    import gc

    from harness.runs import rank

    events = []

    class Held:  # stands for the model: a cycle freed only by the collector
        def __del__(self) -> None:
            events.append("freed")

    monkeypatch.setattr(rank.dist, "destroy_process_group", lambda: events.append("destroyed"))
    was_enabled = gc.isenabled()
    gc.disable()  # no automatic collection between here and the shutdown
    try:
        held = Held()
        held.cycle = held
        del held
        rank._shutdown()
    finally:
        if was_enabled:
            gc.enable()
    assert events == ["freed", "destroyed"]


def test_more_ranks_than_gpus_is_one_line(monkeypatch) -> None:
    import torch

    from harness.common.errors import UsageError

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(UsageError, match=r"--data-parallel 4: only 2 CUDA device\(s\).*--data-parallel 2"):
        distributed.check_devices("torch", "cuda", 4)
    distributed.check_devices("torch", "cuda", 2)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    distributed.check_devices("torch", "cpu", 8)  # gloo: one process per core
    with pytest.raises(UsageError, match=r"--data-parallel 9: .* 8 core\(s\); use --data-parallel 8 or fewer"):
        distributed.check_devices("torch", "cpu", 9)


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_dying_rank_ends_the_run_and_names_it(tmp_path: Path) -> None:
    env = _env(XFPROF_DP_KILL_RANK="1:SIGKILL", TMPDIR=str(tmp_path))
    proc = _harness(["harness.run", "--backend", "torch", *TINY, "--data-parallel", "2", "--quiet"], env)
    assert proc.returncode == 3
    assert "FAILED: rank 1 was killed by SIGKILL" in proc.stdout
    assert "Traceback" not in proc.stdout
    assert _processes_mentioning(str(tmp_path)) == []


def test_a_rank_killed_by_a_signal_keeps_its_last_words(tmp_path: Path) -> None:
    """An abort prints its reason before the signal: the failure names the signal and
    carries the rank's last line of output; a silent rank gets the signal alone."""
    import collections
    import signal

    tail = collections.deque(["loading", "terminate called after throwing an instance of 'gloo::IoException'", ""])
    status, message, priority = distributed._cause(1, -signal.SIGABRT, str(tmp_path), tail)
    assert (status, priority) == ("error", 0)
    assert message == ("rank 1 was killed by SIGABRT; its last output: terminate called after throwing an instance "
                       "of 'gloo::IoException'")
    assert distributed._cause(1, -signal.SIGKILL, str(tmp_path), collections.deque())[1] == (
        "rank 1 was killed by SIGKILL (the kernel's out-of-memory killer sends SIGKILL)")
    assert distributed._cause(0, 1, str(tmp_path), collections.deque())[1] == "rank 0 exited with code 1: no output"


def test_compare_runs_the_other_backend_after_a_dying_rank(tmp_path: Path) -> None:
    # rank 1 exits; rank 0, waiting in a collective, is stopped by the launcher and not blamed
    env = _env(XFPROF_DP_KILL_RANK="1:exit", XLA_FLAGS=HOST_2, JAX_PLATFORMS="cpu")
    proc = _harness(["harness.compare", *TINY, "--backend", "torch,jax", "--mode", "forward", "--data-parallel",
                     "2", "--no-parity", "--out", str(tmp_path)], env)
    assert proc.returncode == 3, proc.stderr[-2000:]
    (folder,) = tmp_path.iterdir()
    assert folder.name.startswith("tiny-ctx16-fp32-ddp2-")
    runs = json.loads((folder / "summary.json").read_text())["runs"]
    assert runs["torch"]["status"] == "error"
    message = runs["torch"]["error"]["message"]
    assert message.startswith("rank 1 exited with code 1: XFPROF_DP_KILL_RANK asked rank 1 to exit (rank 0 ")
    assert runs["jax"]["status"] == "ok" and runs["jax"]["data_parallel"]["global_batch"] == 4


@pytest.mark.skipif(not (shutil.which("c++") or shutil.which("g++")),
                    reason="Inductor's CPU backend needs a C++ compiler (c++ or g++ on PATH)")
def test_torch_compile_under_ddp_on_two_gloo_ranks(tmp_path: Path) -> None:
    """The torch-compile backend with --data-parallel: torch.compile traces the DDP-wrapped
    model; both ranks train their rows and report per-device figures."""
    out = tmp_path / "dp.json"
    proc = _harness(["harness.run", "--backend", "torch-compile", *TINY, "--data-parallel", "2", "--quiet",
                     "--out", str(out)], _env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["data_parallel"]["label"] == "DDP" and doc["status"] == "ok"
    assert doc["ranks"][0]["loss"]["first"] != doc["ranks"][1]["loss"]["first"]
    for rank in doc["ranks"]:
        _assert_per_device(rank["phases"], devices=2)


def test_sigterm_to_the_launcher_stops_its_ranks(tmp_path: Path) -> None:
    """SIGTERM (a time limit's, a scheduler's) to harness.run while its ranks run: the ranks,
    each in a session of its own where no signal to the launcher's group reaches, are
    stopped, not left running; the run ends in one line, exit 130, its work folder removed."""
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", "harness.run", "--backend", "torch", *TINY, "--steps", "100000",
                             "--data-parallel", "2", "--quiet"], cwd=ROOT, env=_env(TMPDIR=str(tmp_path)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while len(ranks := _processes_mentioning(str(tmp_path))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(ranks) == 2
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "error: interrupted by SIGTERM before the run finished; nothing was written"
    assert _processes_mentioning(str(tmp_path)) == [] and os.listdir(tmp_path) == []


COMPILED = r"""
import json, re, numpy as np
from harness.backends.jax.session import JaxSession
from harness.config import get_config
config = get_config("tiny", attention="pallas")
tokens = np.random.default_rng(0).integers(0, config.vocab_size, (4, 17))
s = JaxSession(config, tokens, device="cpu", dtype="fp32", seed=0, data_parallel=2, parallel="ddp")
hlo = s.optimized_hlo()
print(json.dumps({"phases": sorted(hlo), "memory": sorted(s.memory_analysis()),
                  "reduces": {p: len(re.findall(r"all-reduce(?:-start)?\(", t)) for p, t in hlo.items()},
                  "gathers": sum(len(re.findall(r"all-gather(?:-start)?\(", t)) for t in hlo.values())}))
"""


def test_jax_data_parallel_programs_compile_for_layers_and_memory() -> None:
    """The optimized HLO (layer attribution) and XLA's memory account of each program on two
    devices, with the Pallas attention run per device: the programs are traced with the
    session's mesh set, where a trace inside another (the backward's residuals) may not set it
    again. The backward and the fused step sum gradients across the devices; nothing gathers."""
    proc = on_two_host_devices(COMPILED)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    phases = ["backward", "forward", "fused_step", "optimizer"]
    assert got["phases"] == got["memory"] == phases
    assert got["reduces"]["backward"] > 0 and got["reduces"]["fused_step"] > 0
    assert got["gathers"] == 0


SUMMED = r"""
import json, re, numpy as np, jax
from harness.backends.jax.session import JaxSession
from harness.config import get_config
out = {}
for dtype in ("fp32", "bf16"):
    config = get_config("tiny")
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, (4, 17))
    two = JaxSession(config, tokens, device="cpu", dtype=dtype, seed=0, data_parallel=2, parallel="ddp")
    one = JaxSession(config, tokens, device="cpu", dtype=dtype, seed=0)
    text = two._lowered()["fused_step"].as_text()
    losses = [float(s.fused_step()) for s in (one, two)]
    moved = [float(np.max(np.abs(a - b))) for a, b in zip(jax.tree.leaves(one.state), jax.tree.leaves(
        JaxSession(config, tokens, device="cpu", dtype=dtype, seed=0).state))]
    out[dtype] = {"loss": losses, "moved": max(moved), "arrays": len(two._layout.groups),
                  "sums": re.findall(r'"stablehlo\.all_reduce"\(%\w+\).*?\}\) : \(tensor<([^>]*)>\)', text, re.S),
                  "diffs": [float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))))
                            for a, b in zip(jax.tree.leaves(one.state), jax.tree.leaves(two.state))]}
print(json.dumps(out))
"""


def test_jax_replicated_fused_step_sums_each_flat_array_itself() -> None:
    """JAX's replicated fused step on two devices against one device's on the whole batch: it
    sums its gradients itself, one all-reduce per array of the flat layout (in bf16 for the
    arrays of bf16 matmul weights, as XLA sums them when it partitions the step), and one for
    the loss. fp32: the loss to float32 rounding of a mean over two means, the parameters to
    1e-5 (the module's bound). bf16: the loss likewise; a parameter whose gradient is at bf16
    rounding level may step either way, so its bound is the largest move of one step."""
    proc = on_two_host_devices(SUMMED)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    # tiny (d 128, d_ff 512, vocab 10,000): in bf16 each of the two layers' seven matmul weights
    # (4 x 128 x 128 + 3 x 512 x 128) summed in bf16 and its two norms in float32, then the head,
    # then the final norm with the embedding; in fp32 all of them as one array; then the loss
    layer, head = 4 * 128 * 128 + 3 * 512 * 128, 10_000 * 128
    assert got["bf16"]["arrays"] == 6 and got["fp32"]["arrays"] == 1
    assert got["bf16"]["sums"] == [f"{layer}xbf16", "256xf32"] * 2 + [f"{head}xbf16", f"{head + 128}xf32", "f32"]
    assert got["fp32"]["sums"] == [f"{2 * (layer + 256) + 2 * head + 128}xf32", "f32"]
    for dtype in ("fp32", "bf16"):
        np.testing.assert_allclose(got[dtype]["loss"][1], got[dtype]["loss"][0], rtol=4 * 2 ** -23)
    assert max(got["fp32"]["diffs"]) <= 1e-5
    assert max(got["bf16"]["diffs"]) <= got["bf16"]["moved"] * 2
