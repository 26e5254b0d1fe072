"""One forward+backward of an attention kernel, as a target for a kernel profiler.

    ncu --clock-control none -k regex:flash_attention --csv --page details \\
        --section SpeedOfLight --section Occupancy ... \\
        python -m harness.attention_once --backend mosaic --head-dim 64 > kernels.csv
    python -m harness.ncu kernels.csv

Runs `flash_attention` once under `jax.grad` (forward, then the backward
kernels), so each kernel launches exactly once per --repeat.

JAX normally reserves most of the GPU as one pool. Nsight Compute's kernel
replay saves and restores every allocation a kernel could write, so with the
pool in place each replay pass copies tens of GiB to the host and a profile
of a backward kernel times out or fails. This program therefore switches JAX
to plain per-buffer allocations (`XLA_PYTHON_CLIENT_ALLOCATOR=platform`)
before JAX starts.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

DTYPES = {"bf16": jnp.bfloat16, "fp16": jnp.float16, "fp32": jnp.float32}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from pallas_kernels import BACKENDS

    p = argparse.ArgumentParser(prog="python -m harness.attention_once", description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=BACKENDS, default="auto")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    p.add_argument("--causal", choices=("true", "false"), default="true")
    p.add_argument("--repeat", type=int, default=1, help="forward+backward calls after the first (compiling) one")
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu",
                   help="cpu: interpret mode, for checking the program itself")
    p.add_argument("--blocks", default=None, metavar="FIELD=VALUE,...",
                   help="change fields of the backend's default block sizes, e.g. pingpong=False,overlap=True "
                        "(needs --backend triton or mosaic)")
    args = p.parse_args(argv)
    args.overrides = {}
    if args.blocks:
        if args.backend not in ("triton", "mosaic"):
            p.error("--blocks needs --backend triton or mosaic (the block-size fields differ)")
        for item in args.blocks.split(","):
            field, sep, value = item.partition("=")
            if not sep or not field:
                p.error(f"--blocks {args.blocks!r}: expected FIELD=VALUE pairs separated by commas")
            literal = {"true": True, "false": False}.get(value.lower(), value)
            try:
                args.overrides[field] = int(literal) if isinstance(literal, str) else literal
            except ValueError:
                p.error(f"--blocks: {field}={value!r} is neither an integer nor true/false")
    for name in ("batch", "seq", "heads", "head_dim"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.repeat < 0:
        p.error(f"--repeat must be >= 0, got {args.repeat}")
    args.block_sizes = None
    if args.overrides:
        from harness.tune_attention import block_sizes_for

        try:
            args.block_sizes = block_sizes_for(args.backend, args.head_dim, args.overrides, args.seq,
                                                args.causal == "true")
        except (TypeError, ValueError) as exc:
            p.error(f"--blocks {args.blocks!r}: {exc}")
    return args


def run(args: argparse.Namespace) -> tuple[jax.Array, ...]:
    """Compiles and runs forward+backward 1 + args.repeat times; returns the
    last gradients (dq, dk, dv)."""
    from pallas_kernels import flash_attention

    interpret = args.device == "cpu"
    causal = args.causal == "true"
    shape = (args.batch, args.seq, args.heads, args.head_dim)
    q, k, v = (jax.random.normal(jax.random.key(i), shape, jnp.float32).astype(DTYPES[args.dtype])
               for i in range(3))

    def loss(q, k, v):
        o = flash_attention(q, k, v, causal=causal, backend=args.backend, block_sizes=args.block_sizes,
                            interpret=interpret)
        return o.astype(jnp.float32).sum()

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    for _ in range(1 + args.repeat):
        grads = jax.block_until_ready(grad(q, k, v))
    return grads


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = jax.devices("cpu")[0] if args.device == "cpu" else jax.devices()[0]
    if args.device == "gpu" and device.platform != "gpu":
        print(f"attention_once: no GPU visible to JAX (platform {device.platform!r}); "
              "use --device cpu to check the program in interpret mode", file=sys.stderr)
        return 2
    try:
        with jax.default_device(device):
            grads = run(args)
    except ValueError as exc:  # the kernel's own input checks name the limit
        print(f"attention_once: {exc}", file=sys.stderr)
        return 2
    print(f"attention_once: {args.backend} {args.dtype} {args.batch}x{args.seq}x{args.heads}x{args.head_dim} "
          f"causal={args.causal} ran {1 + args.repeat}x; |dq|_max={float(jnp.abs(grads[0]).max()):.4g}")
    return 0


def _exit_without_teardown(rc: int) -> None:
    """Leaves the process without Python's interpreter teardown. Under Nsight
    Compute, JAX's GPU runtime crashed while shutting down (exit 139, head_dim
    128 backward at seq 16384), and the profiler, which writes its report when
    the target exits, then wrote nothing; every kernel had already run."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


if __name__ == "__main__":
    _exit_without_teardown(main())
