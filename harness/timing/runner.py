"""Time one backend's training step, phase by phase, under NVTX ranges (the library
behind `python -m harness.run`).

Each measured step is an NVTX range `step` holding `forward`, `backward` and
`optimizer` (warm-up steps: `warmup`); every phase ends with a device synchronization,
so its range and its host-timed duration cover all of its GPU work. This is the program
that `nsys profile` wraps. The result is a JSON document (`SCHEMA`, `run`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable

from harness.common.cli import UsageError
from harness.common.errors import describe_failure, is_oom
from harness.common.hardware import peak_tflops
from harness.common.results import environment
from harness.common.stats import summarize
from harness.config import ModelConfig, backend_attention, get_config
from harness.timing.flops import FORMULA, optimizer_bytes, phase_flops
from harness.timing.ranges import phase_range

SCHEMA = "harness.run/1"
PHASES = {
    "forward": ("forward",),
    "forward-backward": ("forward", "backward"),
    "train": ("forward", "backward", "optimizer"),
}


@dataclasses.dataclass
class RunOptions:
    backend: str
    model: str
    ctx: int
    batch: int = 4
    warmup: int = 5
    steps: int = 10
    dtype: str = "fp32"
    attention: str = "naive"
    mode: str = "train"
    device: str = "cpu"
    seed: int = 0
    annotate_attention: bool = False
    profile: str | None = None  # write a framework-profiler trace here
    fail_in: str | None = None  # fault injection for tests: raise an OOM in this phase
    optimizer: str = "foreach"  # the torch backends' AdamW: foreach, foreach-compiled or loop


# Every phase a result document may hold, in report order.
PHASE_ORDER = ("forward", "backward", "optimizer", "step", "fused_step")
FAULT_PHASES = ("forward", "backward", "optimizer", "fused_step")


class PhaseFailure(Exception):
    def __init__(self, phase: str, cause: BaseException):
        super().__init__(phase)
        self.phase, self.cause = phase, cause


def _simulated_oom(backend: str) -> BaseException:
    if backend != "jax":
        import torch

        return torch.OutOfMemoryError("CUDA out of memory (simulated by --fail-in)")
    import jax

    return jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory (simulated by --fail-in)")


def make_session(opts: RunOptions, config: ModelConfig):
    """The backend's session on the shared token batch and the shared torch_impl weights."""
    from harness.timing.tokens import make_tokens
    from harness.timing.torch_backend import init_model

    tokens = make_tokens(config.vocab_size, opts.batch, opts.ctx, opts.seed)
    # Both backends start from these weights. They do not depend on the attention
    # kernel; torch has no Pallas kernel, so they come from torch's counterpart.
    weights = init_model(dataclasses.replace(config, attention=backend_attention("torch", config.attention)), opts.seed)
    common = dict(device=opts.device, dtype=opts.dtype, seed=opts.seed, weights=weights)
    if opts.backend == "jax":
        from harness.timing.jax_backend import JaxSession

        return JaxSession(config, tokens, **common)
    from harness.timing.torch_backend import TorchCompileSession, TorchSession

    if opts.backend == "torch":
        return TorchSession(config, tokens, **common, optimizer=opts.optimizer)
    return TorchCompileSession(config, tokens, **common, optimizer=opts.optimizer, backend=opts.backend)


class Timer:
    """Runs phases inside NVTX ranges, synchronizing at each end, and records times and peaks."""

    def __init__(self, session, opts: RunOptions, progress: Callable[[str], None]):
        self.session, self.opts, self.progress = session, opts, progress
        self.times: dict[str, list[float]] = {}
        self.peaks: dict[str, int] = {}
        self.losses: list[float] = []
        self.last_loss = None  # the loss of the latest forward or fused step

    def phase(self, name: str, record: bool) -> None:
        s, opts = self.session, self.opts
        s.reset_peak_memory()
        with phase_range(name):
            t0 = time.perf_counter()
            try:
                if opts.fail_in == name:
                    raise _simulated_oom(opts.backend)
                if name == "forward":
                    out = s.forward(grad=opts.mode != "forward")
                elif name == "backward":
                    out = s.backward()
                elif name == "optimizer":
                    out = s.optimizer_step()
                else:
                    out = s.fused_step()
                s.sync(out)
            except Exception as exc:
                raise PhaseFailure(name, exc) from exc
            dt = (time.perf_counter() - t0) * 1e3
        if name in ("forward", "fused_step") and out is not None:
            self.last_loss = out
        if record:
            self.times.setdefault(name, []).append(dt)
            peak = s.peak_memory()
            if peak is not None:
                self.peaks[name] = max(self.peaks.get(name, 0), peak)

    def step(self, phases: tuple[str, ...], record: bool, outer: str | None) -> float:
        t0 = time.perf_counter()
        with phase_range(outer if record else "warmup") if outer or not record else contextlib.nullcontext():
            for name in phases:
                self.phase(name, record)
        if self.opts.mode == "forward-backward":
            self.session.zero_grad()
        return (time.perf_counter() - t0) * 1e3

    def loop(self, label: str, phases: tuple[str, ...], outer: str | None = "step") -> None:
        """Warm-up steps, then measured ones; `outer` names the range around each measured step."""
        o = self.opts
        for i in range(o.warmup):
            self.progress(f"{label}: warm-up {i + 1}/{o.warmup}")
            self.step(phases, False, outer)
        for i in range(o.steps):
            self.progress(f"{label}: step {i + 1}/{o.steps}")
            dt = self.step(phases, True, outer)
            if outer:
                self.times.setdefault(outer, []).append(dt)
            self.losses.append(float(self.last_loss))


def plain_loop_ms(session, opts: RunOptions) -> float:
    """Mean step time of back-to-back steps with no ranges and one sync at the end.

    The instrumented step over this ratio is the cost of the per-phase ranges and syncs."""
    for _ in range(max(1, min(opts.warmup, 2))):
        session.plain_step()
    session.sync()
    t0 = time.perf_counter()
    for _ in range(opts.steps):
        out = session.plain_step()
    session.sync(out)
    return (time.perf_counter() - t0) * 1e3 / opts.steps


def phase_record(times: list[float], flops: int, tokens: int, peak_tf: float | None,
                 peak_mem: int | None, extra: dict | None = None) -> dict:
    rec = summarize(times)
    seconds = rec["median_ms"] / 1e3
    rec["times_ms"] = times
    rec["tokens_per_s"] = tokens / seconds if seconds else None
    rec["flops"] = flops
    rec["tflops"] = flops / seconds / 1e12 if flops and seconds else None
    rec["mfu"] = rec["tflops"] / peak_tf if rec["tflops"] and peak_tf else None
    rec["peak_memory_bytes"] = peak_mem
    rec.update(extra or {})
    return rec


def run(opts: RunOptions, progress: Callable[[str], None] = lambda msg: None) -> dict:
    """Build, warm up and time one backend; returns the result document (status ok or failed)."""
    config = get_config(opts.model, attention=opts.attention)
    result = {"schema": SCHEMA, "status": "ok", "error": None, "options": dataclasses.asdict(opts),
              "config": dataclasses.asdict(config), "num_params": config.num_params,
              "flops_formula": FORMULA}
    result["options"].pop("fail_in")
    phase = "setup"
    try:
        session = make_session(opts, config)
        result["precision"] = _precision(opts)
        timer = Timer(session, opts, lambda m: progress(f"[{opts.backend}] {m}"))
        with _instrumented(opts):
            timer.loop("split step", PHASES[opts.mode])
            if opts.backend == "jax" and opts.mode == "train":
                phase = "fused_step"
                timer.loop("fused step", ("fused_step",), outer=None)
        overhead = None
        if opts.mode == "train":
            phase = "plain loop"
            progress(f"[{opts.backend}] plain loop of {opts.steps} steps (overhead check)")
            plain = plain_loop_ms(session, opts)
            ref = "fused_step" if opts.backend == "jax" else "step"
            overhead = {"plain_step_ms": plain, "instrumented_step_ms": summarize(timer.times[ref])["median_ms"],
                        "compared": f"median {ref} with ranges and per-phase syncs vs mean of a plain loop"}
            overhead["ratio"] = overhead["instrumented_step_ms"] / plain
    except PhaseFailure as exc:
        return _failed(result, exc.phase, exc.cause, opts)
    except Exception as exc:
        return _failed(result, phase, exc, opts)

    device_name = session.device_name()
    peak_tf = peak_tflops(device_name, opts.dtype)
    flops = phase_flops(config, opts.batch, opts.ctx)
    flops["step"] = sum(flops[p] for p in PHASES[opts.mode])
    tokens = opts.batch * opts.ctx
    phases = {}
    for name, times in timer.times.items():
        extra = None
        if name == "optimizer":
            bytes_moved = optimizer_bytes(config)
            extra = {"bytes": bytes_moved, "gb_per_s": bytes_moved / (summarize(times)["median_ms"] / 1e3) / 1e9}
        phases[name] = phase_record(times, flops[name], tokens, peak_tf, timer.peaks.get(name), extra)
    result.update(
        phases=phases,
        overhead=overhead,
        loss={"first": timer.losses[0], "last": timer.losses[-1]},
        peak_tflops=peak_tf,
        memory_note=("torch: max_memory_allocated after a reset before each phase" if opts.backend != "jax" else
                     "jax: the allocator's peak_bytes_in_use after the phase (a process-wide high-water mark)"),
        env=environment({"device": device_name or "cpu", **session.versions()}),
    )
    return result


@contextlib.contextmanager
def _instrumented(opts: RunOptions):
    """The optional extras around the timed loops: attention ranges, a framework profiler."""
    with contextlib.ExitStack() as stack:
        if opts.annotate_attention:
            if opts.attention != "naive":
                raise UsageError("--annotate-attention needs --attention naive (the fused kernels have no steps)")
            _annotate_attention(opts)
            if opts.backend == "jax":
                # Ranges inside a jitted function would be traced away: run op by op.
                import jax

                stack.enter_context(jax.disable_jit())
        if opts.profile:
            from harness.timing.ranges import use_framework_annotations
            from harness.trace import framework_profile

            use_framework_annotations("jax" if opts.backend == "jax" else "torch")
            recorder = framework_profile.jax_profiler if opts.backend == "jax" else framework_profile.torch_profiler
            stack.enter_context(recorder(opts.profile))
        yield


def _annotate_attention(opts: RunOptions) -> None:
    from harness.timing.ranges import annotate_attention

    if opts.backend != "jax":
        import torch

        from torch_impl.model import CausalSelfAttention

        sync = (lambda out: torch.cuda.synchronize()) if opts.device == "cuda" else (lambda out: None)
        annotate_attention(CausalSelfAttention, sync)
    else:
        import jax

        from jax_impl.model import CausalSelfAttention

        annotate_attention(CausalSelfAttention, jax.block_until_ready)


def _precision(opts: RunOptions) -> str:
    if opts.backend == "jax":
        from harness.timing.jax_backend import PRECISION
    elif opts.backend == "torch":
        from harness.timing.torch_backend import PRECISION
    else:
        from harness.timing.torch_backend import COMPILED_PRECISION as PRECISION
    return PRECISION[opts.dtype]


def _failed(result: dict, phase: str, exc: BaseException, opts: RunOptions) -> dict:
    result.update(status="oom" if is_oom(exc) else "error",
                  error={"phase": phase, "message": describe_failure(exc, phase, opts)})
    result["env"] = environment()
    return result


def format_result(doc: dict) -> str:
    o = doc["options"]
    head = (f"{o['backend']} {o['model']} ctx {o['ctx']} batch {o['batch']} {o['dtype']} {o['attention']} "
            f"{o['mode']} on {o['device']}")
    if doc["status"] != "ok":
        return f"{head}: FAILED: {doc['error']['message']}"
    lines = [head, f"{'phase':<11} {'median ms':>10} {'std':>8} {'TFLOP/s':>8} {'MFU':>6} {'peak MiB':>9}"]
    for name, p in doc["phases"].items():
        tf = f"{p['tflops']:.2f}" if p["tflops"] else "-"
        mfu = f"{100 * p['mfu']:.1f}%" if p["mfu"] else "-"
        mem = f"{p['peak_memory_bytes'] / 2**20:.0f}" if p["peak_memory_bytes"] else "-"
        lines.append(f"{name:<11} {p['median_ms']:>10.3f} {p['std_ms']:>8.3f} {tf:>8} {mfu:>6} {mem:>9}")
    if doc.get("overhead"):
        lines.append(f"instrumentation overhead: {doc['overhead']['ratio']:.3f}x a plain loop")
    return "\n".join(lines)
