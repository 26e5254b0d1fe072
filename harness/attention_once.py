"""One forward+backward of an attention kernel, as a target for a kernel profiler.

    ncu --clock-control none -k regex:flash_attention --csv --page details \\
        --section SpeedOfLight --section Occupancy ... \\
        python -m harness.attention_once --backend mosaic --head-dim 64 > kernels.csv
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
from harness.attention.options import add_device_arg
from harness.cli.dialect import make_parser
from harness.cli.dialect import parse_args as parse_cli

__all__ = ["main", "parse_args", "run"]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The parsed options; `args.block_sizes` holds the --blocks overrides applied (or None)."""
    from pallas_kernels import BACKENDS

    p = make_parser("harness.attention_once", __doc__)
    p.add_argument("--backend", choices=BACKENDS, default="auto", help=f"kernel family: {', '.join(BACKENDS)}")
    p.add_argument("--batch", type=int, default=1, help="batch size")
    p.add_argument("--seq", type=int, default=4096, help="sequence length")
    p.add_argument("--heads", type=int, default=16, help="attention heads")
    p.add_argument("--head-dim", type=int, default=64, help="head dimension")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16", help=f"{', '.join(DTYPES)}")
    p.add_argument("--causal", choices=("true", "false"), default="true", help="true or false")
    p.add_argument("--repeat", type=int, default=1, help="forward+backward calls after the first (compiling) one")
    add_device_arg(p, "interpret mode, for checking the program itself")
    p.add_argument("--blocks", default=None, metavar="FIELD=VALUE,...",
                   help="change fields of the backend's default block sizes, e.g. overlap=True,consumers=2 "
                        "(needs --backend triton or mosaic)")
    args = parse_cli(p, argv)
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
        try:
            args.block_sizes = block_sizes_for(args.backend, args.head_dim, args.overrides, args.seq,
                                                args.causal == "true")
        except (TypeError, ValueError) as exc:
            p.error(f"--blocks {args.blocks!r}: {exc}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    import jax
    import jax.numpy as jnp

    args = parse_args(argv)
    device = jax.devices("cpu")[0] if args.device == "cpu" else jax.devices()[0]
    if args.device == "cuda" and device.platform != "gpu":
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
