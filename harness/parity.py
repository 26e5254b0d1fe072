"""Parity of the PyTorch and JAX models: same weights, same batch, same numbers?

    python -m harness.parity --model tiny --device cpu [--out parity.json]

Compares logits, loss, every gradient, and every parameter and parameter update after
--steps AdamW steps by relative error against the tolerance table of
`harness.timing.parity`; exit status 1 when any tensor is over its bound.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from harness.common.cli import (
    UsageError,
    add_model_args,
    add_out,
    fail,
    make_parser,
    parse_args,
    positive_int,
    select_platform,
)
from harness.common.errors import describe_failure
from harness.common.results import write_json
from harness.config import get_config
from harness.timing.parity import check_parity, format_table


def build_parser() -> argparse.ArgumentParser:
    p = make_parser("harness.parity", __doc__)
    add_model_args(p, ctx_default=64, batch_default=2)
    p.add_argument("--steps", type=positive_int, default=5, help="AdamW steps before comparing parameters")
    add_out(p, "also write the result as JSON here", metavar="PATH.json")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    try:
        select_platform(args)
    except UsageError as exc:
        return fail(str(exc))
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch shares the GPU here
    config = get_config(args.model, attention=args.attention)
    try:
        result = check_parity(config, batch=args.batch, ctx=args.ctx, device=args.device, dtype=args.dtype,
                              seed=args.seed, steps=args.steps)
    except Exception as exc:  # an OOM or a backend failure is reported, not a traceback
        return fail(describe_failure(exc, "parity", args))
    print(format_table(result))
    if args.out:
        write_json(args.out, result.to_json())
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
