"""Time one backend's training step, phase by phase, under NVTX ranges (the library
behind `python -m harness.run`).

Each measured step is an NVTX range `step` holding `forward`, `backward` and
`optimizer` (warm-up steps: `warmup`); every phase ends with a device synchronization,
so its range and its host-timed duration cover all of its GPU work. This is the program
that `nsys profile` wraps. The result is a JSON document (`RUN_SCHEMA`, `run`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path

from harness import backends
from harness.backends import Backend
from harness.backends.session import Session
from harness.common.documents import RUN_SCHEMA, Status
from harness.common.errors import UsageError, describe_failure, is_oom
from harness.common.hardware import boost_mhz, peak_tflops
from harness.common.results import environment, visible_gpu_ids
from harness.common.stats import summarize
from harness.config import ModelConfig, get_config
from harness.timing.clocks import ClockSampler, open_sampler, peak_at_clock
from harness.timing.clocks import summarize as clock_summary
from harness.timing.events import EventLog
from harness.timing.flops import FORMULA, optimizer_bytes, phase_flops
from harness.timing.layer_ranges import LayerRanges
from harness.timing.plants import wide_block
from harness.timing.spec import RunSpec
from harness.timing.timer import PhaseFailure, Timer

PHASES = {
    "forward": ("forward",),
    "forward-backward": ("forward", "backward"),
    "train": ("forward", "backward", "optimizer"),
}


FIGURES = {"flops": "per device (the work of --batch rows)", "tflops": "per device", "mfu": "per device",  # covers
           "peak_tflops": "per device", "tokens_per_s": "whole job (N devices x --batch rows)"}
JAX_LAYERS = ("jax.named_scope per block and sub-module in jax_impl: metadata of the compiled program, joined "
              "to the kernels afterwards; nothing is added to the step")
FAULT_PHASES = ("forward", "backward", "optimizer", "fused_step")


def make_session(opts: RunSpec, config: ModelConfig) -> Session:
    """The backend's session on the shared token batch and the shared seeded weights.

    Data-parallel: the global batch is the one a one-device run of `data_parallel x batch`
    trains on; a backend that drives every device from one process shards it, one with a
    process per device takes this rank's rows (`Backend.make_session`)."""
    from harness.timing.tokens import make_tokens

    tokens = make_tokens(config.vocab_size, opts.batch * opts.data_parallel, opts.ctx, opts.seed)
    return backends.get(opts.backend).make_session(opts, config, tokens)


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


def run(opts: RunSpec, progress: Callable[[str], None] = lambda msg: None) -> dict:
    """Build, warm up and time one backend; returns the result document (status ok or failed)."""
    config = wide_block(get_config(opts.model, attention=opts.attention), opts.wide_layer, opts.wide_factor)
    result = {"schema": RUN_SCHEMA, "status": Status.OK.value, "error": None, "options": dataclasses.asdict(opts),
              "config": dataclasses.asdict(config), "num_params": config.num_params,
              "flops_formula": FORMULA, "warnings": []}
    for where in ("fail_in", "hlo_dir"):  # a test's fault, and where this process wrote: not how it ran
        result["options"].pop(where)
    if opts.annotate_attention:
        result["warnings"].append("--annotate-attention: an attribution run (synchronizations inside attention; "
                                  "JAX runs the step op by op): its times are not speed figures")
    if opts.warmup == 0:
        result["warnings"].append("--warmup 0: the first measured step includes compilation, autotuning and "
                                  "first allocations (see first_step_ms); use --warmup 2 or more for speed figures")
    phase = "setup"
    backend = backends.get(opts.backend)
    fault = (lambda name: backend.simulated_oom() if name == opts.fail_in else None)
    clocks = _clock_sampler(opts, backend)  # a sampler, the reason there is none, or None on a CPU run
    with EventLog(backend.compile_events) as events, \
            (clocks if isinstance(clocks, ClockSampler) else contextlib.nullcontext()):
        try:
            t0 = time.perf_counter()
            session = make_session(opts, config)
            setup_ms = (time.perf_counter() - t0) * 1e3
            result["precision"] = backend.precision[opts.dtype]
            timer = Timer(session, opts, lambda m: progress(f"[{opts.backend}] {m}"), events, fault, backend.compiles)
            layers = LayerRanges(session) if opts.layer_ranges and backend.layer_ranges == "hooks" else None
            if opts.layer_ranges and backend.layer_ranges == "hlo":
                result["layer_ranges"] = {"overhead_ratio": None, "method": JAX_LAYERS}
            with _instrumented(opts, backend):
                try:
                    timer.loop("split step", PHASES[opts.mode])
                except PhaseFailure as exc:
                    if not _fused_step_still_runs(opts, backend, exc):
                        raise
                    result["split_step_failure"] = _drop_split_step(timer, exc, opts)
                    result["warnings"].append(f"split step: {result['split_step_failure']['message']}; "
                                              "the fused step, one program with less to keep, was timed alone")
                if backend.fused_step and opts.mode == "train":
                    phase = "fused_step"
                    timer.loop("fused step", ("fused_step",), outer=None)
            overhead = None
            if opts.mode == "train":
                phase = "overhead check"
                fused = backend.fused_step
                overhead = timer.overhead(("fused_step",) if fused else PHASES[opts.mode], None if fused else "step")
            if layers is not None:
                phase = "layer ranges overhead check"
                result["layer_ranges"] = layers.overhead(timer, PHASES[opts.mode])
            if opts.layer_ranges and backend.layer_ranges == "hlo" and opts.hlo_dir:
                # the folder's name beside the result (an absolute path would not survive a move)
                written = session.write_hlo(opts.hlo_dir)
                result["layer_ranges"]["hlo"] = {"folder": Path(opts.hlo_dir).name, "phases": sorted(written)}
        except PhaseFailure as exc:
            return _failed(result, exc.phase, exc.cause, opts)
        except Exception as exc:
            return _failed(result, phase, exc, opts)

    device_name = session.device_name()
    # Every device of a data-parallel step does the work of --batch rows (a rank of a backend
    # with a process per device, or one of the devices one process drives): FLOPs, TFLOP/s,
    # MFU and the peak are per device; tokens/s counts the whole job's N x --batch rows.
    peak_tf = peak_tflops(device_name, opts.dtype)
    flops = phase_flops(config, opts.batch, opts.ctx)
    flops["step"] = sum(flops[p] for p in PHASES[opts.mode])
    tokens = opts.batch * opts.data_parallel * opts.ctx
    phases = {}
    for name, times in timer.times.items():
        extra = None
        if name == "optimizer":
            bytes_moved = optimizer_bytes(config)
            extra = {"bytes": bytes_moved, "gb_per_s": bytes_moved / (summarize(times)["median_ms"] / 1e3) / 1e9}
        phases[name] = phase_record(times, flops[name], tokens, peak_tf, timer.peaks.get(name), extra)
        for out in phases[name]["outliers"]:
            out["causes"] = timer.causes(name, out["index"]) or ["no garbage collection or compilation recorded"]
    first = timer.first_step_ms
    result.update(
        phases=phases,
        overhead=overhead,
        first_step={"setup_ms": setup_ms, **{f"{label.replace(' ', '_')}_ms": ms for label, ms in first.items()},
                    "time_to_first_step_ms": setup_ms + first.get("split step", first.get("fused step", 0.0)),
                    "note": "setup: model, weights and batch on the device; a loop's first step: tracing, "
                            "compilation, autotuning, first allocations and the step itself"},
        loss=_loss_record(timer.losses),
        peak_tflops=peak_tf,
        figures=FIGURES,
        memory_note=backend.memory_note,
        env=environment({"device": device_name or "cpu", **session.versions(), **_compiler_options(session)}),
    )
    if isinstance(clocks, ClockSampler):
        result["gpu_clocks"] = _clock_record(clocks, timer, phases, peak_tf, device_name)
    elif clocks:
        result["gpu_clocks"] = {"not_sampled": clocks}
    if opts.data_parallel > 1:  # time.perf_counter is CLOCK_MONOTONIC on Linux: one clock for a host's ranks
        result["intervals_ns"] = {name: [[int(a * 1e9), int(b * 1e9)] for a, b in spans]
                                  for name, spans in timer.intervals.items()}
    if overhead and overhead.get("flag"):
        result["warnings"].append(f"instrumentation overhead: {overhead['flag']}")
    if (layers := result.get("layer_ranges")) and layers.get("flag"):
        result["warnings"].append(f"layer ranges overhead: {layers['flag']}")
    return result


def _compiler_options(session: Session) -> dict:
    """`{"compiler_options": ...}` where the session compiles its programs with options of its
    own (JAX's sharded parameters), else nothing."""
    options = getattr(session, "compiler_options", None)
    return {"compiler_options": options} if options else {}


def _fused_step_still_runs(opts: RunSpec, backend: Backend, exc: PhaseFailure) -> bool:
    """Whether the fused step is still worth timing after the split step failed: it ran
    out of memory in the forward or backward (the split step keeps the forward's residuals
    between two programs; the fused step frees them inside one), which leave the weights
    and optimizer state as they were (JAX's update donates them)."""
    return (backend.fused_step and opts.mode == "train" and exc.phase in ("forward", "backward")
            and is_oom(exc.cause))


def _drop_split_step(timer: Timer, exc: PhaseFailure, opts: RunSpec) -> dict:
    """Forget a failed split step's partial figures and buffers; returns its failure record."""
    timer.drop("split step", PHASES[opts.mode])
    return {"status": Status.OOM.value, "phase": exc.phase, "message": describe_failure(exc.cause, exc.phase, opts)}


def _loss_record(losses: list[dict]) -> dict:
    """First and last measured loss of the split loop, with the optimizer steps taken before
    each, so two backends compare at equal step counts; every measured loss is kept."""
    split = [x for x in losses if x["loop"] == "split step"] or losses
    return {"first": split[0]["loss"], "last": split[-1]["loss"], "first_after_steps": split[0]["step"],
            "last_after_steps": split[-1]["step"], "measured": losses}


@contextlib.contextmanager
def _instrumented(opts: RunSpec, backend: Backend):
    """The optional extras around the timed loops: attention ranges, a framework profiler."""
    with contextlib.ExitStack() as stack:
        if opts.annotate_attention:
            if opts.attention != "naive":
                raise UsageError("--annotate-attention needs --attention naive (the fused kernels have no steps)")
            if backend.annotate_attention is None:
                raise UsageError(f"--annotate-attention: --backend {backend.name} cannot hold ranges inside attention")
            stack.enter_context(backend.annotate_attention(opts.device))
        if opts.framework_profile:
            from harness.backends.ranges import use_framework_annotations

            use_framework_annotations(backend.annotation())
            stack.enter_context(backend.profiler(opts.framework_profile))
        yield


def _clock_sampler(opts: RunSpec, backend: Backend) -> ClockSampler | str | None:
    """The sampler of the GPUs this process computes on (`harness.timing.clocks`): a rank of a
    backend with a process per device its LOCAL_RANK's, a one-process run its first
    --data-parallel devices; the reason it cannot sample; None on a CPU run."""
    if opts.device != "cuda":
        return None
    if opts.data_parallel > 1 and not backend.one_process:
        devices = [int(os.environ.get("LOCAL_RANK", "0"))]
    else:
        devices = list(range(opts.data_parallel))
    return open_sampler(devices, visible_gpu_ids())


def _clock_record(sampler: ClockSampler, timer: Timer, phases: dict, peak_tf: float | None,
                  device_name: str | None) -> dict:
    """`clocks.summarize` of the measured calls, with each phase's MFU against the peak at its
    median clock (`mfu_at_clock`) where the datasheet's boost clock is known."""
    record = clock_summary(sampler.samples, timer.intervals, sampler.power_reading)
    record["boost_mhz"] = boost_mhz(device_name)
    for name, rec in record["phases"].items():
        tflops = (phases.get(name) or {}).get("tflops")
        peak = peak_at_clock(peak_tf, record["boost_mhz"], (rec.get("sm_mhz") or {}).get("median"))
        rec["mfu_at_clock"] = tflops / peak if tflops and peak else None
    return record


def _failed(result: dict, phase: str, exc: BaseException, opts: RunSpec) -> dict:
    result.update(status=(Status.OOM if is_oom(exc) else Status.ERROR).value,
                  error={"phase": phase, "message": describe_failure(exc, phase, opts)})
    result["env"] = environment()
    return result
