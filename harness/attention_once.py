"""One forward+backward of an attention kernel, as a target for a kernel profiler.

    ncu --clock-control none -k regex:flash_attention --csv --page details \\
        --section SpeedOfLight --section Occupancy ... \\
        python -m harness.attention_once --kernel mosaic --head-dim 64 > kernels.csv
    python -m harness.ncu kernels.csv

Each kernel launches exactly once per --repeat; JAX allocates per buffer instead of from
its pool, so Nsight Compute's kernel replay stays small (`harness.attention.once`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from harness.attention.catalog import DTYPES
from harness.attention.impls import block_sizes_for
from harness.attention.once import run
from harness.attention.options import OnceOptions, add_kernel
from harness.cli.dialect import add_batch, add_device, choice, fail, make_parser, non_negative_int, positive_int
from harness.cli.dialect import parse_args as parse_cli

__all__ = ["main", "parse_args", "run"]


def build_parser() -> argparse.ArgumentParser:
    from pallas_kernels import BACKENDS

    p = make_parser("harness.attention_once", __doc__)
    add_kernel(p, BACKENDS, "auto", "our kernel family (auto: mosaic where it can run the inputs, else triton)")
    add_batch(p, 1)
    p.add_argument("--seq", type=positive_int, default=4096, help="sequence length")
    p.add_argument("--heads", type=positive_int, default=16, help="attention heads")
    p.add_argument("--head-dim", type=positive_int, default=64, help="head dimension")
    p.add_argument("--dtype", type=choice("dtype", tuple(DTYPES)), default="bf16", help=f"{', '.join(DTYPES)}")
    p.add_argument("--causal", type=choice("causal", ("true", "false")), default="true", help="true or false")
    p.add_argument("--repeat", type=non_negative_int, default=1,
                   help="forward+backward calls after the first (compiling) one")
    add_device(p, "cuda", cpu_means="interpret mode, for checking the program itself")
    p.add_argument("--blocks", default=None, metavar="FIELD=VALUE,...",
                   help="change fields of the kernel family's default block sizes, e.g. overlap=True,consumers=2 "
                        "(needs --kernel triton or mosaic)")
    return p


def parse_args(argv: Sequence[str] | None = None) -> OnceOptions:
    """The options; `block_sizes` holds the --blocks overrides applied (or None)."""
    p = build_parser()
    args = parse_cli(p, argv)
    args.overrides = {}
    if args.blocks:
        if args.kernel not in ("triton", "mosaic"):
            p.error("--blocks needs --kernel triton or mosaic (the block-size fields differ)")
        for item in args.blocks.split(","):
            field, sep, value = item.partition("=")
            if not sep or not field:
                p.error(f"--blocks {args.blocks!r}: expected FIELD=VALUE pairs separated by commas")
            literal = {"true": True, "false": False}.get(value.lower(), value)
            try:
                args.overrides[field] = int(literal) if isinstance(literal, str) else literal
            except ValueError:
                p.error(f"--blocks: {field}={value!r} is neither an integer nor true/false")
    block_sizes = None
    if args.overrides:
        try:
            block_sizes = block_sizes_for(args.kernel, args.head_dim, args.overrides, args.seq, args.causal == "true")
        except (TypeError, ValueError) as exc:
            p.error(f"--blocks {args.blocks!r}: {exc}")
    return OnceOptions.from_args(args, block_sizes)


def main(argv: Sequence[str] | None = None) -> int:
    import jax
    import jax.numpy as jnp

    args = parse_args(argv)
    device = jax.devices("cpu")[0] if args.device == "cpu" else jax.devices()[0]
    if args.device == "cuda" and device.platform != "gpu":
        return fail(f"--device cuda: no GPU visible to JAX (platform {device.platform!r}); "
                    "use --device cpu to check the program in interpret mode")
    try:
        with jax.default_device(device):
            grads = run(args)
    except ValueError as exc:  # the kernel's own input checks name the limit
        print(f"attention_once: {exc}", file=sys.stderr)
        return 2
    print(f"attention_once: {args.kernel} {args.dtype} {args.batch}x{args.seq}x{args.heads}x{args.head_dim} "
          f"causal={str(args.causal).lower()} ran {1 + args.repeat}x; |dq|_max={float(jnp.abs(grads[0]).max()):.4g}")
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
