"""The typed descriptions of a run and of a comparison, and the command line that runs one.

A `RunSpec` is built once, from `harness.run`'s options, from `harness.compare`'s (one
per backend, `Comparison.run_spec`) or from a sweep cell, and passed down unchanged; a
`harness.run` subprocess gets its command line from `run_argv` alone.
"""

from __future__ import annotations

import dataclasses
import os
import sys

from harness.backends import backend_attention
from harness.backends import get as backend_record

# Every phase a result document may hold, in report order.
PHASE_ORDER = ("forward", "backward", "optimizer", "step", "fused_step")


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One backend's timed run: what `python -m harness.run` takes."""

    backend: str
    model: str
    ctx: int
    batch: int = 4  # per device; the global batch is data_parallel x batch
    warmup: int = 5
    steps: int = 10
    dtype: str = "fp32"
    attention: str = "naive"
    mode: str = "train"
    device: str = "cpu"
    seed: int = 0
    annotate_attention: bool = False
    framework_profile: str | None = None  # write the framework profiler's trace here
    fail_in: str | None = None  # fault injection for tests: raise an OOM in this phase
    optimizer: str = "fused"  # the torch backends' AdamW: one of harness.config.OPTIMIZERS
    layer_ranges: bool = False  # per-layer ranges (Backend.layer_ranges says how)
    wide_layer: int | None = None  # a planted wide block (ModelConfig.wide_layer), for attribution tests
    wide_factor: int = 1
    data_parallel: int = 1  # devices
    parallel: str = "ddp"  # torch: ddp or fsdp; jax: replicated (ddp), sharded (fsdp), AdamW state sharded (zero1)
    # The DDP/FSDP2 wrap (backends with Backend.wrap_options):
    ddp_bucket_mb: float | None = None  # DDP's bucket_cap_mb (None: the backend's default, Backend.ddp_bucket_mb)
    ddp_static_graph: bool = False  # DDP's static_graph
    grad_comm: str = "fp32"  # DDP's gradient all-reduce: fp32, or bf16 (bf16_compress_hook)
    fsdp_reshard_after_forward: bool = True  # FSDP2: free the gathered parameters after the forward
    hlo_dir: str | None = None  # with layer_ranges "hlo": write the phases' optimized HLO here

    def on(self, backend: str, fail_in: str | None = None) -> RunSpec:
        """This run on `backend`: the attention kernel it runs for the one asked, layer
        ranges only where it has them, the DDP/FSDP2 wrap options only where it takes them,
        `fail_in` planted."""
        record = backend_record(backend)
        wrap = {} if record.wrap_options else WRAP_DEFAULTS
        return dataclasses.replace(self, backend=backend, attention=backend_attention(backend, self.attention),
                                   layer_ranges=self.layer_ranges and bool(record.layer_ranges), fail_in=fail_in,
                                   **wrap)


# The DDP/FSDP2 wrap options as a backend without them runs (Backend.wrap_options).
WRAP_DEFAULTS = {f.name: f.default for f in dataclasses.fields(RunSpec)
                 if f.name in ("ddp_bucket_mb", "ddp_static_graph", "grad_comm", "fsdp_reshard_after_forward")}


def run_argv(spec: RunSpec, out: str | None = None) -> list[str]:
    """The `python -m harness.run` command line that runs `spec` (writing `out`)."""
    argv = [sys.executable, "-m", "harness.run", "--backend", spec.backend, "--model", spec.model,
            "--ctx", str(spec.ctx), "--batch", str(spec.batch), "--dtype", spec.dtype, "--attention", spec.attention,
            "--device", spec.device, "--seed", str(spec.seed), "--mode", spec.mode, "--warmup", str(spec.warmup),
            "--steps", str(spec.steps), "--optimizer", spec.optimizer]
    flags = {"--annotate-attention": spec.annotate_attention, "--layer-ranges": spec.layer_ranges}
    argv += [flag for flag, on in flags.items() if on]
    if spec.wide_layer is not None:
        argv += ["--wide-layer", str(spec.wide_layer), "--wide-factor", str(spec.wide_factor)]
    for flag, value in (("--framework-profile", spec.framework_profile), ("--fail-in", spec.fail_in), ("--out", out)):
        if value is not None:
            argv += [flag, value]
    if spec.data_parallel > 1:
        argv += ["--data-parallel", str(spec.data_parallel), "--parallel", spec.parallel]
        if spec.ddp_bucket_mb:
            argv += ["--ddp-bucket-mb", f"{spec.ddp_bucket_mb:g}"]
        if spec.ddp_static_graph:
            argv.append("--ddp-static-graph")
        if spec.grad_comm != "fp32":
            argv += ["--grad-comm", spec.grad_comm]
        if not spec.fsdp_reshard_after_forward:
            argv += ["--fsdp-reshard-after-forward", "false"]
    return argv


@dataclasses.dataclass(frozen=True)
class Comparison:
    """A `harness.compare` run: the options every backend's run shares (`run`, whose
    backend is the first), the backends, and what the comparison itself does."""

    run: RunSpec
    backends: tuple[str, ...]
    out: str = "results"
    profiler: str | None = None  # "nsys", "framework" or None
    nsys_bin: str | None = None
    compile_cache: str | None = None  # None: a temporary one for this comparison
    overwrite: bool = False
    no_parity: bool = False
    keep_profiles: str | None = None
    fail_in: str | None = None  # "backend:phase", for tests
    timeline: bool = False  # write timeline.json.gz from the profiles
    timeline_steps: tuple[int, ...] | str | None = None  # the measured steps it lays out (None: every one)

    def run_spec(self, backend: str) -> RunSpec:
        """The run of `backend` in this comparison."""
        planted, _, phase = (self.fail_in or "").partition(":")
        return self.run.on(backend, phase if planted == backend else None)


def compile_cache_env(directory: str) -> dict[str, str]:
    """The variables that point both compilers' persistent caches into `directory`.

    JAX_COMPILATION_CACHE_DIR turns on JAX's persistent cache, which also keeps XLA's
    per-fusion GEMM autotuning results; at large model sizes autotuning is most of the
    compile time. For torch.compile, Inductor's FX graph cache (compiled graphs, keyed by
    graph, inputs and configuration) goes to `directory`/inductor and Triton's compiled
    kernels to `directory`/triton, so a later process skips Inductor's code generation
    and Triton's compilation."""
    directory = os.path.abspath(directory)
    return {"JAX_COMPILATION_CACHE_DIR": directory, "TORCHINDUCTOR_CACHE_DIR": os.path.join(directory, "inductor"),
            "TRITON_CACHE_DIR": os.path.join(directory, "triton"), "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"}
