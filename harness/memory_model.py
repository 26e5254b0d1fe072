"""Predicted peak device memory of one torch training step, per phase (`harness.sweeps.memory_model`).

    python -m harness.memory_model --model large --ctx 256 --batch 4 --dtype bf16

Prints the state, activation and per-phase peak predictions in GiB: parameters,
gradients, AdamW state, what autograd saves per layer, and the logits. The sweep report
sets them beside measured peaks.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from harness.common.cli import add_attention, add_batch, add_ctx, add_dtype, add_model, make_parser, parse_args
from harness.config import get_config
from harness.sweeps.memory_model import predict

GIB = 2**30


def build_parser() -> argparse.ArgumentParser:
    p = make_parser("harness.memory_model", __doc__)
    add_model(p)
    add_ctx(p)
    add_batch(p)
    add_dtype(p)
    add_attention(p)
    return p


def format_prediction(pred: dict) -> str:
    """One line per term and per phase peak, in GiB."""
    lines = [f"{'state':<12} {name:<22} {n / GIB:10.3f}" for name, n in pred["state"].items()]
    lines += [f"{'saved':<12} {name:<22} {n / GIB:10.3f}" for name, n in pred["activations"].items()]
    lines += [f"{'peak':<12} {name:<22} {n / GIB:10.3f}" for name, n in pred["peaks"].items()]
    return "\n".join([f"{'kind':<12} {'term':<22} {'GiB':>10}", *lines])


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    config = get_config(args.model, attention=args.attention)
    print(f"{args.model} ctx {args.ctx} batch {args.batch} {args.dtype} attention {args.attention}")
    print(format_prediction(predict(config, args.batch, args.ctx, args.dtype)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
