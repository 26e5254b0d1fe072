"""The JAX family: jax_impl with separately jitted phases and a fused step.

The session is `harness.backends.jax.session.JaxSession`; this module says what the harness
needs to know about it, importing JAX only when a session, a profiler or a check is asked for.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from contextlib import AbstractContextManager

from harness.backends import Backend
from harness.backends.tolerances import COMPILED_TOLERANCES

PRECISION = {
    "fp32": "everything in float32; matmul precision 'highest' (no TF32, which XLA uses by default)",
    "tf32": "float32 storage; XLA's default matmul precision (TF32 tensor cores on Ampere and newer)",
    "bf16": (
        "matmul weights (every 2-D parameter but the embedding) cast to bf16 inside the jitted "
        "step and linear inputs cast to the weight dtype, so matmuls take bf16 and give bf16; "
        "embedding, residual stream, RMSNorm (float32 inside), softmax and loss in float32; "
        "float32 master weights, gradients and AdamW state; on several devices XLA sums each matmul "
        "weight's gradient across them in bf16, its dtype in the backward (as torch's --grad-comm bf16 "
        "does), before the cast to float32"
    ),
}
MEMORY_NOTE = "jax: the allocator's peak_bytes_in_use after the phase (a process-wide high-water mark)"
# XLA's own NVTX ranges (domain "TSL") break the nsys importer ("Cannot find string for
# an exterior index"), which then drops every kernel record; the harness's ranges live
# in the default domain, so excluding TSL keeps kernels and phase ranges.
NSYS_FLAGS = ("--nvtx-domain-exclude=TSL",)
# Relative-error bounds against eager torch per dtype. float32 reorderings give ~1e-6 on
# logits and grads; the bounds leave room for GPU reduction orders and still sit orders
# of magnitude below what a wrong RoPE pairing, a missing scale or a swapped weight
# produces (0.1 to 1, see tests/test_parity.py). AdamW's first steps move each weight by
# about lr * sign(g), so weights whose gradient is at rounding level can step either way:
# the update bound is looser than the gradient bound for that reason.
PARALLEL = {
    "ddp": "replicated (parameters and AdamW state on every device)",
    "fsdp": ("sharded parameters, collectives merged (each parameter and its AdamW state split along its first "
             "axis N divides; XLA merges independent all-gathers into ones of up to 256 MiB, reduce-scatters into "
             "ones of up to 16 MiB, or as XLA_FLAGS sets, and schedules them to hide under compute)"),
    "zero1": "sharded optimizer state (parameters replicated, AdamW state split along the data axis)",
}
TOLERANCES = COMPILED_TOLERANCES


# Set to the XLA_FLAGS a probe accepted, so that the subprocesses a tool starts need not probe again.
XLA_FLAGS_CHECKED = "HARNESS_XLA_FLAGS_CHECKED"
_PROBE = "import jax; jax.devices()"


def xla_flags_problem() -> str | None:
    """What XLA says of $XLA_FLAGS, in one line naming the variable and the bad flag, or None.

    XLA parses XLA_FLAGS when JAX starts its backend and aborts the process on a flag it
    does not know (or a first word without "--", which it takes for a file name): a run or
    a comparison's JAX child would die after the others' work. A subprocess starting JAX's
    CPU backend with the same XLA_FLAGS (a second or two) finds it first; a probe that
    cannot tell (it times out) refuses nothing."""
    flags = os.environ.get("XLA_FLAGS", "")
    if not flags.strip() or os.environ.get(XLA_FLAGS_CHECKED) == flags:
        return None
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "JAX_PLATFORMS": "cpu"})
    except subprocess.TimeoutExpired:
        return None
    if done.returncode == 0:
        os.environ[XLA_FLAGS_CHECKED] = flags
        return None
    lines = [line for line in done.stderr.splitlines() if "XLA_FLAGS" in line] or done.stderr.strip().splitlines()
    said = (lines[-1].split("] ", 1)[-1].strip() if lines else f"exit status {done.returncode}")[:300]
    return f"XLA_FLAGS={flags!r}: JAX cannot start with it ({said}); fix that flag or unset XLA_FLAGS"


def _make_session(opts, config, tokens):
    """JAX over every data-parallel device of this process, from the shared seeded torch
    weights (torch has no Pallas kernel, so they come from its counterpart: the weights do
    not depend on the attention kernel)."""
    from harness.backends import backend_attention
    from harness.backends.jax.session import JaxSession
    from harness.backends.weights import init_model

    weights = init_model(dataclasses.replace(config, attention=backend_attention("torch", config.attention)),
                         opts.seed)
    return JaxSession(config, tokens, device=opts.device, dtype=opts.dtype, seed=opts.seed, weights=weights,
                      data_parallel=opts.data_parallel, parallel=opts.parallel, layer_ranges=opts.layer_ranges)


def _annotate_attention(device: str) -> AbstractContextManager:
    """Ranges around naive attention's three steps; ranges inside a jitted function would
    be traced away, so the step runs op by op."""
    import jax

    from harness.backends.ranges import annotate_attention
    from jax_impl.model import CausalSelfAttention

    annotate_attention(CausalSelfAttention, jax.block_until_ready)
    return jax.disable_jit()


def _profiler(path: str) -> AbstractContextManager:
    from harness.backends.profilers import jax_profiler

    return jax_profiler(path)


def _annotation():
    import jax

    return jax.profiler.TraceAnnotation


def _oom() -> BaseException:
    import jax

    return jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory (simulated by --fail-in)")


JAX = Backend(name="jax", make_session=_make_session, precision=PRECISION, attention=("naive", "fused", "pallas"),
              memory_note=MEMORY_NOTE, fused_step=True, layer_ranges="hlo", annotate_attention=_annotate_attention,
              nsys_flags=NSYS_FLAGS, parallel=PARALLEL, one_process=True, profile_file="jax-trace",
              profiler=_profiler, annotation=_annotation, compile_events="jax.monitoring", simulated_oom=_oom,
              tolerances=TOLERANCES, default=True, compile_weight=3,
              compiles=True, environment_problem=xla_flags_problem, framework="JAX",
              libraries=("jax",), bf16_gradient_sums=True)
RECORDS = (JAX,)
