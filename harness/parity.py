"""Parity of the backends against eager torch: same weights, same batch, same numbers?

    python -m harness.parity --model tiny --device cpu [--backend jax,torch-compile] [--out parity.json]

Compares each backend's logits, loss, every gradient, and every parameter and parameter
update after --steps AdamW steps with eager torch's by relative error against the
tolerance tables of `harness.timing.parity`; exit status 1 when any tensor is over its
bound. By default every backend that can run here is compared (torch-compile on CPU
needs a C++ compiler, torch-compile-cg a GPU); the skipped ones are named on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from harness import backends
from harness.common.cli import (
    UsageError,
    add_model_args,
    add_out,
    choice,
    comma_list,
    fail,
    make_parser,
    parse_args,
    positive_int,
    select_platform,
)
from harness.common.errors import describe_failure, is_oom
from harness.common.results import write_json
from harness.config import get_config
from harness.timing.parity import check_parity, format_table


def build_parser() -> argparse.ArgumentParser:
    p = make_parser("harness.parity", __doc__)
    add_model_args(p, ctx_default=64, batch_default=2)
    p.add_argument("--steps", type=positive_int, default=5, help="AdamW steps before comparing parameters")
    compared = backends.compared()
    p.add_argument("--backend", type=comma_list(choice("backend", compared)), default=None,
                   help=f"comma-separated backends compared with eager torch: {', '.join(compared)} "
                        "(None: every one that can run here)")
    add_out(p, "also write the result as JSON here", metavar="PATH.json")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    try:
        select_platform(args)
        args.backend = backends.choose_backends(args.backend, backends.compared(), args.device, "parity")
    except UsageError as exc:
        return fail(str(exc))
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch shares the GPU here
    config = get_config(args.model, attention=args.attention)
    try:
        result = check_parity(config, batch=args.batch, ctx=args.ctx, device=args.device, dtype=args.dtype,
                              seed=args.seed, steps=args.steps, backends=tuple(args.backend))
    except Exception as exc:  # an OOM or a backend failure is reported, not a traceback
        message = describe_failure(exc, "parity", args)
        if args.out:
            write_json(args.out, {"ok": None, "status": "oom" if is_oom(exc) else "error", "error": message,
                                  "batch": args.batch})
        return fail(message)
    print(format_table(result))
    if args.out:
        write_json(args.out, result.to_json())
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
