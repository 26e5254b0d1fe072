"""The PyTorch family: eager torch (the reference), torch.compile, torch.compile with CUDA graphs.

The sessions are `harness.backends.torch.session.TorchSession` and `TorchCompileSession`;
this module says what the harness needs to know about each, importing torch only when
a session, a profiler or a check is asked for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
from contextlib import AbstractContextManager

from harness.backends import Backend, backend_attention, get
from harness.backends.tolerances import COMPILED_TOLERANCES

PRECISION = {
    "fp32": "everything in float32; TF32 off for matmuls and cuDNN",
    "tf32": "float32 storage; matmuls and convolutions on TF32 tensor cores",
    "bf16": (
        "torch.autocast(bfloat16): matmul inputs (linear layers, attention products, SDPA) cast "
        "to bf16 with bf16 outputs; embedding, residual stream, RMSNorm (float32 inside), softmax "
        "and loss in float32; float32 master weights, gradients and AdamW state"
    ),
}
# torch.compile keeps the eager program's dtypes; Inductor fuses and reorders its ops.
COMPILED_PRECISION = {dtype: f"{text}; compiled by Inductor, which fuses pointwise ops and reductions and "
                             "may reorder float32 sums" for dtype, text in PRECISION.items()}
MEMORY_NOTE = "torch: max_memory_allocated after a reset before each phase"
PARALLEL = {"ddp": "DDP", "fsdp": "FSDP2"}  # DistributedDataParallel, FSDP2 fully_shard
# Under DDP, Dynamo's DDPOptimizer cuts the compiled graph at every gradient bucket so that
# each bucket's all-reduce can start while the backward goes on; each cut is one more graph
# to launch and a fusion boundary. At DDP's 25 MB buckets `large` (3.9 GB of float32
# gradients) becomes about 155 graphs; 250 MB buckets make about 16, still enough to
# overlap every all-reduce but the last with the backward.
COMPILED_DDP_BUCKET_MB = 250.0
# FSDP2 gathers and frees every block's parameters in hooks between the compiled graphs,
# which CUDA graphs do not follow: measured on four GPUs, a step ran tens of times slower
# than under DDP (results/several-gpus/scaling-large-ctx1024-bf16-h200x4, fifth start).
CUDA_GRAPHS_FSDP = ("torch-compile-cg's CUDA graphs do not follow FSDP2's per-block all-gathers (a step runs tens "
                    "of times slower than under DDP); use --backend torch-compile, or --parallel ddp")
COMPILED_LAYER_RANGES = ("module hooks would break the compiled graph at every layer (no fusion across layers, "
                         "another program than the one timed); use --backend torch or jax")


def inductor_cpu_compiler() -> str | None:
    """The C++ compiler Inductor's CPU backend builds its kernels with ($CXX, else g++), or
    None when none is on PATH; a lookup, nothing is compiled."""
    from torch._inductor import config

    names = config.cpp.cxx if isinstance(config.cpp.cxx, (list, tuple)) else (config.cpp.cxx,)
    found = [shutil.which(name) for name in names if name]
    return next((path for path in found if path), None)


def _compiled_unavailable(name: str, device: str) -> str | None:
    if device == "cpu" and inductor_cpu_compiler() is None:
        return f"{name} on CPU needs a C++ compiler for Inductor's kernels and found none (install g++ or set $CXX)"
    return None


def _cudagraphs_unavailable(device: str) -> str | None:
    if device != "cuda":
        return "torch-compile-cg replays CUDA graphs and needs --device cuda; on CPU use torch-compile"
    return None


def _make_session(name: str):
    def make(opts, config, tokens):
        """A torch session from the shared seeded weights. Data-parallel: this rank takes its
        rows of the global batch and wraps its model (`harness.backends.torch.parallel.distribute`)."""
        from harness.backends.torch.session import TorchCompileSession, TorchSession, init_model

        config = dataclasses.replace(config, attention=backend_attention(name, config.attention))
        common = dict(device=opts.device, dtype=opts.dtype, seed=opts.seed, weights=init_model(config, opts.seed),
                      optimizer=opts.optimizer)
        n = opts.data_parallel
        if n > 1:
            from harness.backends.torch.parallel import world

            rank = world()[0]
            tokens = tokens[rank * opts.batch:(rank + 1) * opts.batch]
        record = get(name)
        if record.compile_mode is None:
            session = TorchSession(config, tokens, **common)
        elif reason := record.unavailable(opts.device):
            raise ValueError(reason)
        else:
            session = TorchCompileSession(config, tokens, **common, mode=record.compile_mode)
        if n > 1:
            from harness.backends.torch.parallel import distribute

            distribute(session, opts)
        return session

    return make


def _annotate_attention(device: str) -> AbstractContextManager:
    """Ranges around naive attention's three steps, each ended by a synchronization."""
    import torch

    from harness.backends.ranges import annotate_attention
    from torch_impl.model import CausalSelfAttention

    sync = (lambda out: torch.cuda.synchronize()) if device == "cuda" else (lambda out: None)
    annotate_attention(CausalSelfAttention, sync)
    return contextlib.nullcontext()


def _profiler(path: str) -> AbstractContextManager:
    from harness.backends.profilers import torch_profiler

    return torch_profiler(path)


def _annotation():
    import torch

    return torch.profiler.record_function


def _oom() -> BaseException:
    import torch

    return torch.OutOfMemoryError("CUDA out of memory (simulated by --fail-in)")


# torch.compile against eager torch: the same program, but Inductor fuses ops and
# reorders float32 reductions (tiled sums, fused softmax and RMSNorm), a few 1e-7 of
# relative error per op that compounds over the layers. Measured on CPU, fp32, batch 2:
# `tiny` (2 layers, ctx 32) logits 3.3e-7, loss 1.0e-7, worst grad 6.8e-7, param 1.7e-7,
# update 4.7e-6; `mini` (4 layers, ctx 64) logits 4.1e-7, grad 9.6e-7, param 5.4e-7,
# update 1.1e-5. The bounds are ~20x the deeper model's errors, rounded up (GPU
# reductions order sums differently again), and still four orders of magnitude below
# a planted bug (0.1 to 1); the update bound stays loose for AdamW's sign-like first
# steps. In tf32 and bf16 Inductor keeps fused intermediates in float32 where eager
# rounds them to the low precision (bf16 `tiny`: logits 4.0e-3, update 2.9e-2), the
# same size of difference as between torch and JAX: the JAX table's bounds.
COMPILE_TOLERANCES: dict[str, dict[str, float]] = {
    "fp32": {"logits": 1e-5, "loss": 2e-6, "grad": 2e-5, "param": 1e-5, "update": 1e-3},
    "tf32": COMPILED_TOLERANCES["tf32"],
    "bf16": COMPILED_TOLERANCES["bf16"],
}

_FAMILY = dict(attention=("naive", "fused"), stand_in={"pallas": "fused"}, memory_note=MEMORY_NOTE,
               parallel=PARALLEL, wrap_options=True, memory_model=True, profiler=_profiler, annotation=_annotation,
               compile_events="dynamo", framework="torch", gathers_parameters=True, libraries=("torch",),
               simulated_oom=_oom)
EAGER = Backend(name="torch", make_session=_make_session("torch"), precision=PRECISION, layer_ranges="hooks",
                annotate_attention=_annotate_attention, reference=True, default=True, **_FAMILY)
COMPILED = Backend(name="torch-compile", make_session=_make_session("torch-compile"),
                   compile_mode="default",
                   precision=COMPILED_PRECISION,
                   unavailable=lambda device: _compiled_unavailable("torch-compile", device),
                   layer_ranges_problem=COMPILED_LAYER_RANGES, tolerances=COMPILE_TOLERANCES, default=True,
                   ddp_bucket_mb=COMPILED_DDP_BUCKET_MB, compiles=True, **_FAMILY)
CUDA_GRAPHS = Backend(name="torch-compile-cg", make_session=_make_session("torch-compile-cg"),
                      compile_mode="reduce-overhead",
                      precision=COMPILED_PRECISION,
                      unavailable=lambda device: (_cudagraphs_unavailable(device)
                                                  or _compiled_unavailable("torch-compile-cg", device)),
                      devices=("cuda",), layer_ranges_problem=COMPILED_LAYER_RANGES,
                      tolerances=COMPILE_TOLERANCES, ddp_bucket_mb=COMPILED_DDP_BUCKET_MB,
                      parallel_refused={"fsdp": CUDA_GRAPHS_FSDP}, compiles=True, **_FAMILY)
RECORDS = (EAGER, COMPILED, CUDA_GRAPHS)
