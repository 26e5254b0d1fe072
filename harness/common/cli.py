"""The one command-line dialect of every `python -m harness.<tool>`: parser, options, errors.

Every tool builds its parser with `make_parser` (no abbreviations, defaults shown in
`--help`) and takes the options it shares with others from the `add_*` functions here,
so the same thing has the same name, choices and default everywhere. A bad value ends
the program with one line on stderr that names the option and what it takes, exit code 2:
argument types raise `UsageError` (an `argparse.ArgumentTypeError`, so argparse prefixes
"argument --steps: "), and checks after parsing report theirs with `fail`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from harness import backends
from harness.common.errors import UsageError
from harness.config import ATTENTION_CHOICES, PRESETS

DTYPES = ("fp32", "tf32", "bf16")
MODES = ("forward", "forward-backward", "train")
DEVICES = ("cuda", "cpu")
# The torch backends' AdamW: torch_impl.AdamW foreach, the same under torch.compile, the per-parameter loop.
OPTIMIZERS = ("foreach", "foreach-compiled", "fused", "loop")
# Data-parallel flavours: torch DDP or FSDP2; JAX parameters replicated or sharded to match.
PARALLEL = ("ddp", "fsdp")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults appended to every option's help; the description's layout kept."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (`error: argument --x: ...; see --help`)
    instead of the usage block and a second line."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def make_parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """The parser of `python -m <prog>`: its description is the first paragraph of `doc`."""
    return Parser(prog=f"python -m {prog}", description=(doc or "").split("\n\n")[0],
                  formatter_class=HelpFormatter, allow_abbrev=False)


def choice(kind: str, valid: Sequence[str]) -> Callable[[str], str]:
    """An argparse type that rejects anything outside `valid` with a one-line message.

    `valid` stays readable on the returned function (`.valid`) for tests and help."""

    def parse(value: str) -> str:
        if value not in valid:
            raise UsageError(f"unknown {kind} {value!r}; choose one of {', '.join(valid)}")
        return value

    parse.__name__ = kind
    parse.valid = tuple(valid)  # type: ignore[attr-defined]
    return parse


def comma_list(parse: Callable[[str], object]) -> Callable[[str], list]:
    """An argparse type for "a,b,c", each item checked by `parse`, duplicates dropped."""

    def parse_list(value: str) -> list:
        items = [parse(v.strip()) for v in value.split(",") if v.strip()]
        if not items:
            raise UsageError(f"expected a comma-separated list, got {value!r}")
        return list(dict.fromkeys(items))

    parse_list.__name__ = getattr(parse, "__name__", "list")
    parse_list.valid = getattr(parse, "valid", None)  # type: ignore[attr-defined]
    return parse_list


def _int_at_least(minimum: int, what: str) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = minimum - 1
        if number < minimum:
            raise UsageError(f"expected a {what} integer, got {value!r}")
        return number

    parse.__name__ = f"{what.replace('-', '_')}_int"
    return parse


positive_int = _int_at_least(1, "positive")
non_negative_int = _int_at_least(0, "non-negative")


def non_negative_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not number >= 0:
        raise UsageError(f"expected a number >= 0, got {value!r}")
    return number


def _one_or_many(parse: Callable[[str], object], many: bool) -> Callable[[str], object]:
    return comma_list(parse) if many else parse


# -- options shared by several tools -----------------------------------------------------
def add_model(parser: argparse.ArgumentParser, *, many: bool = False, default: str | None = "tiny") -> None:
    what = "comma-separated presets" if many else "preset"
    parser.add_argument("--model", type=_one_or_many(choice("model", list(PRESETS)), many),
                        default=[default] if many and default else default,
                        help=f"{what} of harness/config.py: {', '.join(PRESETS)}")


def add_ctx(parser: argparse.ArgumentParser, *, many: bool = False, default: int | None = None,
            required: bool = True) -> None:
    parser.add_argument("--ctx", type=_one_or_many(positive_int, many), default=default,
                        required=required and default is None and not many,
                        help="context lengths, comma-separated" if many else "context length (tokens per sequence)")


def add_batch(parser: argparse.ArgumentParser, default: int = 4, *, many: bool = False) -> None:
    parser.add_argument("--batch", type=_one_or_many(positive_int, many), default=[default] if many else default,
                        help="sequences per batch" + (", comma-separated" if many else ""))


def add_dtype(parser: argparse.ArgumentParser, *, many: bool = False) -> None:
    parser.add_argument("--dtype", type=_one_or_many(choice("dtype", DTYPES), many),
                        default=["fp32"] if many else "fp32",
                        help=f"{'comma-separated: ' if many else ''}{', '.join(DTYPES)}; fp32 turns TF32 off in "
                             "both frameworks, bf16 is mixed precision with float32 master weights")


def add_attention(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--attention", type=choice("attention", ATTENTION_CHOICES), default="naive",
                        help=f"{', '.join(ATTENTION_CHOICES)}: explicit QK^T/softmax/PV, the framework's fused SDPA, "
                             "or our Pallas kernel (JAX; torch runs its fused SDPA opposite it)")


def add_backend(parser: argparse.ArgumentParser, *, many: bool = False) -> None:
    """--backend, one or comma-separated, from the registered backends (`harness.backends`)."""
    names = backends.names()
    if many:
        parser.add_argument("--backend", type=comma_list(choice("backend", names)), default=list(names),
                            help=f"comma-separated: {', '.join(names)}")
    else:
        parser.add_argument("--backend", type=choice("backend", names), required=True,
                            help=f"{', '.join(names)}")


def add_optimizer(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--optimizer", type=choice("optimizer", OPTIMIZERS), default="fused",
                        help="the torch backends' AdamW (torch_impl.AdamW): foreach (torch._foreach_* ops), "
                             "foreach-compiled (the same under torch.compile), fused (torch's fused AdamW kernel "
                             "driven to compute ours), loop (per parameter); JAX runs jax_impl.adamw")


def add_device(parser: argparse.ArgumentParser, default: str | None = None) -> None:
    """--device cuda|cpu; default None means cuda when a GPU is visible (resolved by `select_platform`)."""
    parser.add_argument("--device", type=choice("device", DEVICES), default=default,
                        help=f"{', '.join(DEVICES)}" + ("; None: cuda if a GPU is visible, else cpu"
                                                        if default is None else ""))


def add_seed(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=non_negative_int, default=0, help="seed of the weights and the token batch")


def add_steps(parser: argparse.ArgumentParser, *, warmup: int = 5, steps: int = 10) -> None:
    parser.add_argument("--warmup", type=non_negative_int, default=warmup,
                        help="warm-up steps before timing (NVTX range warmup)")
    parser.add_argument("--steps", type=positive_int, default=steps, help="measured steps (NVTX range step)")


def add_mode(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", type=choice("mode", MODES), default="train",
                        help=f"phases of a step: {', '.join(MODES)}")


def add_model_args(parser: argparse.ArgumentParser, *, ctx_default: int | None = None, batch_default: int = 4,
                   ctx_required: bool = True) -> None:
    """The model-and-batch options of run, compare and parity; `ctx_required=False` for a
    tool that checks --ctx itself (compare, which does without it under --render)."""
    add_model(parser)
    add_ctx(parser, default=ctx_default, required=ctx_required)
    add_batch(parser, batch_default)
    add_dtype(parser)
    add_attention(parser)
    add_device(parser)
    add_seed(parser)


def add_data_parallel(parser: argparse.ArgumentParser, *, many: bool = False) -> None:
    """--data-parallel N (devices; --batch stays per device) and --parallel ddp|fsdp."""
    parser.add_argument("--data-parallel", type=_one_or_many(positive_int, many), default=[1] if many else 1,
                        metavar="N" + (",N..." if many else ""),
                        help=("comma-separated device counts, " if many else "devices: ") +
                             "torch starts one process per device (NCCL on cuda, gloo on cpu), JAX shards the "
                             "batch over N devices of one process; --batch is per device (global batch N x batch)")
    parser.add_argument("--parallel", type=choice("parallel", PARALLEL), default="ddp",
                        help=f"{', '.join(PARALLEL)}: torch DistributedDataParallel or FSDP2 fully_shard; JAX "
                             "parameters replicated or sharded along their first axis N divides")


def add_nsys_bin(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nsys-bin", metavar="BIN", default=None,
                        help="the nsys binary; None: $NSYS, then nsys on PATH")


def add_out(parser: argparse.ArgumentParser, help: str, default: str | None = None, metavar: str = "PATH") -> None:
    parser.add_argument("--out", default=default, metavar=metavar, help=help)


# -- parsing and failing -----------------------------------------------------------------
def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """parse_args of a `make_parser` parser: a bad value ends the program with one line
    that names the option (exit code 2)."""
    return parser.parse_args(argv)


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
    """Print `error: message` on stderr; return `code` for the caller's exit."""
    print(f"error: {message}", file=sys.stderr)
    return code


def emit(text: str, out: str | os.PathLike | None) -> None:
    """Write a rendered report to `out` (a path) and say so, or print it when `out` is None."""
    if out is None:
        print(text, end="")
        return
    with open(out, "w") as f:
        f.write(text)
    print(f"wrote {out}")
