"""Command-line pieces shared by the harness entry points: options, validation, errors."""

from __future__ import annotations

import argparse
import os
import sys

from harness.config import ATTENTION_CHOICES, PRESETS, get_config

BACKENDS = ("torch", "jax")
DTYPES = ("fp32", "tf32", "bf16")
MODES = ("forward", "forward-backward", "train")
DEVICES = ("cuda", "cpu")


class UsageError(Exception):
    """Bad input: the message names the bad value and the valid choices."""


def choice(kind: str, valid: tuple[str, ...] | list[str]):
    """An argparse type that rejects anything outside `valid` with a one-line message."""

    def parse(value: str) -> str:
        if value not in valid:
            raise UsageError(f"unknown {kind} {value!r}; choose one of {', '.join(valid)}")
        return value

    parse.__name__ = kind
    return parse


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number <= 0:
        raise UsageError(f"expected a positive integer, got {value!r}")
    return number


def non_negative_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise UsageError(f"expected a non-negative integer, got {value!r}")
    return number


def add_model_args(parser: argparse.ArgumentParser, *, ctx_default: int | None = None, batch_default: int = 4) -> None:
    parser.add_argument("--model", type=choice("model", list(PRESETS)), default="tiny", help=f"preset: {', '.join(PRESETS)}")
    parser.add_argument("--ctx", type=positive_int, default=ctx_default, required=ctx_default is None,
                        help="context length (tokens per sequence)")
    parser.add_argument("--batch", type=positive_int, default=batch_default)
    parser.add_argument("--dtype", type=choice("dtype", DTYPES), default="fp32",
                        help="fp32 (TF32 off in both), tf32, or bf16 mixed precision")
    parser.add_argument("--attention", type=choice("attention", ATTENTION_CHOICES), default="naive")
    parser.add_argument("--device", type=choice("device", DEVICES), default=None,
                        help="cuda if a GPU is present, else cpu")
    parser.add_argument("--seed", type=non_negative_int, default=0)


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """parse_args, but bad values end the program with one line naming the choices."""
    try:
        return parser.parse_args(argv)
    except UsageError as exc:
        sys.exit(fail(str(exc)))


def config_from_args(args: argparse.Namespace):
    return get_config(args.model, attention=args.attention)


def gpu_available() -> bool:
    import torch

    return torch.cuda.is_available()


def select_platform(args: argparse.Namespace) -> None:
    """Resolve --device and point JAX at the same platform; call before JAX initialises."""
    if args.device is None:
        args.device = "cuda" if gpu_available() else "cpu"
    elif args.device == "cuda" and not gpu_available():
        raise UsageError("--device cuda: no CUDA GPU is visible to this process; use --device cpu")
    if args.device == "cpu":
        os.environ["JAX_PLATFORMS"] = "cpu"


def fail(message: str, code: int = 2) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def emit(text: str, out) -> None:
    """Write a rendered report to `out` (a path) and say so, or print it when `out` is None."""
    if out is None:
        print(text, end="")
        return
    with open(out, "w") as f:
        f.write(text)
    print(f"wrote {out}")
