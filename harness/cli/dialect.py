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

from harness import backends, started
from harness.common.errors import UsageError
from harness.common.results import write_text
from harness.config import ATTENTION_CHOICES, DEVICES, DTYPES, GRAD_COMM, MODES, OPTIMIZERS, PARALLEL, PRESETS


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's default appended to its help as the user would type it ("fp32,bf16",
    not a Python list); none for a required option, a switch, a default of None (whose
    meaning, where it has one, the help text gives) or an empty list (a repeatable option
    given no times). The description's layout kept."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (action.required or default is None or default is argparse.SUPPRESS or isinstance(default, bool)
                or default == [] or not action.option_strings):
            return text
        shown = ",".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (`error: argument --x: ...; see --help`)
    instead of the usage block and a second line."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


LAUNCHER: str | None = None  # `xfprof` (or `python -m harness`), set by `harness.__main__` when it dispatches


def make_parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """The parser of `python -m <prog>`, named as the user started it (`xfprof <tool>` through the
    `LAUNCHER`) so that errors' "see ... --help" reads as typed; its description is `doc`'s first paragraph."""
    name = f"{LAUNCHER} {prog.removeprefix('harness.').replace('_', '-')}" if LAUNCHER else f"python -m {prog}"
    return Parser(prog=name, description=(doc or "").split("\n\n")[0],
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
    """An argparse type for "a,b,c", each item checked by `parse`; an item given twice is
    refused (a sweep or comparison would run it twice, or the second would silently go)."""

    def parse_list(value: str) -> list:
        items = [parse(v.strip()) for v in value.split(",") if v.strip()]
        if not items:
            raise UsageError(f"expected a comma-separated list, got {value!r}")
        repeated = [v for i, v in enumerate(items) if v in items[:i]]
        if repeated:
            raise UsageError(f"{repeated[0]} is listed twice in {value!r}; list each value once")
        return items

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


def positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not number > 0:
        raise UsageError(f"expected a number > 0, got {value!r}")
    return number


# The largest device memory a --device-memory-gb may name: beyond any accelerator made (the
# largest hold a few hundred GiB), so a larger figure is a unit slip (bytes, MiB), not a device.
MAX_DEVICE_GIB = 10_000


def device_gib(value: str) -> float:
    """An argparse type for --device-memory-gb: GiB above 0 and at most MAX_DEVICE_GIB."""
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not 0 < number <= MAX_DEVICE_GIB:
        raise UsageError(f"expected GiB of one device, above 0 and at most {MAX_DEVICE_GIB} (e.g. 80), got {value!r}")
    return number


def add_device_memory(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--device-memory-gb", type=device_gib, default=None, metavar="GIB", help=help)


def _one_or_many(parse: Callable[[str], object], many: bool) -> Callable[[str], object]:
    return comma_list(parse) if many else parse


# -- options shared by several tools -----------------------------------------------------
def add_model(parser: argparse.ArgumentParser, *, many: bool = False, default: str | None = "tiny",
              without: str = "") -> None:
    """--model; `without`: what a default of None means, for the help."""
    what = "comma-separated presets" if many else "preset"
    parser.add_argument("--model", type=_one_or_many(choice("model", list(PRESETS)), many),
                        default=[default] if many and default else default,
                        help=f"{what} of harness/config.py: {', '.join(PRESETS)}"
                        + (f" ({without})" if without else ""))


def add_ctx(parser: argparse.ArgumentParser, *, many: bool = False, default: int | None = None,
            required: bool = True, without: str = "") -> None:
    """--ctx; `required=False` for a tool that requires it itself outside a mode such as
    --render, and `without` what its absence means, for the help."""
    parser.add_argument("--ctx", type=_one_or_many(positive_int, many), default=default,
                        required=required and default is None and not many,
                        help=("context lengths, comma-separated" if many else "context length (tokens per sequence)")
                        + (f" ({without})" if without else ""))


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


def backend_names() -> tuple[str, ...]:
    """The --backend choices: every registered backend (`harness.backends`)."""
    return backends.names()


def loaded_backends() -> tuple[str, ...]:
    """The registered backends' names, loading the plugins first: for a tool that reads
    backends by name, before it does any work; a plugin that cannot be loaded ends the tool
    here, in one line."""
    try:
        return backends.names()
    except UsageError as exc:
        sys.exit(fail(str(exc)))


def add_backend(parser: argparse.ArgumentParser, *, many: bool = False) -> None:
    """--backend, one or comma-separated, from the registered backends (`harness.backends`);
    a plugin that cannot be loaded ends the tool here, in one line."""
    names = loaded_backends()
    if many:
        parser.add_argument("--backend", type=comma_list(choice("backend", names)), default=None,
                            help=f"comma-separated: {', '.join(names)} (None: {','.join(backends.defaults())}, "
                                 "less those that cannot run here or cannot honour the other options, each "
                                 "named on stderr)")
    else:
        parser.add_argument("--backend", type=choice("backend", names), required=True,
                            help=f"{', '.join(names)}")


def add_optimizer(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--optimizer", type=choice("optimizer", OPTIMIZERS), default="fused",
                        help="the torch backends' AdamW (torch_impl.AdamW): foreach (torch._foreach_* ops), "
                             "foreach-compiled (the same under torch.compile), fused (torch's fused AdamW kernel "
                             "driven to compute ours), loop (per parameter); JAX runs jax_impl.adamw")


def add_device(parser: argparse.ArgumentParser, default: str | None = None, cpu_means: str = "") -> None:
    """--device cuda|cpu; default None means cuda when a GPU is visible (resolved by `select_platform`);
    `cpu_means`: what a CPU run is good for, where it is good for less than a GPU run."""
    parser.add_argument("--device", type=choice("device", DEVICES), default=default,
                        help=f"{', '.join(DEVICES)}" + ("; None: cuda if a GPU is visible, else cpu"
                                                        if default is None else "")
                        + (f"; cpu: {cpu_means}" if cpu_means else ""))


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
    add_ctx(parser, default=ctx_default, required=ctx_required,
            without="" if ctx_required or ctx_default else "required unless --render")
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
                             "parameters replicated, or sharded along their first axis N divides (with their AdamW "
                             "state), or (zero1, JAX only) replicated with the AdamW state sharded")
    parser.add_argument("--ddp-bucket-mb", type=positive_float, default=None, metavar="MB",
                        help="torch DDP: gradient bucket size (bucket_cap_mb); None: 250 for the compiled backends "
                             "(each bucket cuts their graph), DDP's default 25 for eager torch")
    parser.add_argument("--ddp-static-graph", action="store_true",
                        help="torch DDP: static_graph=True (the same parameters used every step)")
    parser.add_argument("--grad-comm", type=choice("grad-comm", GRAD_COMM), default="fp32",
                        help=f"{', '.join(GRAD_COMM)}: torch DDP's gradient all-reduce in float32, or in bf16 "
                             "(bf16_compress_hook: half the bytes, bf16 rounding of the summed gradients)")
    parser.add_argument("--fsdp-reshard-after-forward", type=choice("fsdp-reshard-after-forward", ("true", "false")),
                        default="true",
                        help="true, false: torch FSDP2 frees the gathered parameters after the forward (true) or "
                             "keeps them for the backward (false: one all-gather fewer per step, more memory)")


def add_nsys_bin(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nsys-bin", metavar="BIN", default=None,
                        help="the nsys binary; None: $NSYS, then nsys on PATH")


def add_out(parser: argparse.ArgumentParser, help: str, default: str | None = None, metavar: str = "PATH") -> None:
    parser.add_argument("--out", default=default, metavar=metavar, help=help)


def add_overwrite(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--overwrite", action="store_true",
                        help=f"replace an existing {what} (without it, the tool refuses to start)")


# -- parsing and failing -----------------------------------------------------------------
def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """parse_args of a `make_parser` parser: a bad value ends the program with one line
    that names the option (exit code 2). From here on Ctrl-C raises KeyboardInterrupt
    (`harness.started`)."""
    started()
    return parser.parse_args(argv)


def given_options(parser: argparse.ArgumentParser, args: argparse.Namespace, keep: Sequence[str] = ()) -> list[str]:
    """The options of `args` set away from their defaults, less the destinations in `keep`:
    for a mode such as --render that runs nothing, so that an option that cannot apply is
    refused instead of silently ignored."""
    return [action.option_strings[0] for action in parser._actions
            if action.option_strings and action.dest not in keep and action.default is not argparse.SUPPRESS
            and getattr(args, action.dest, action.default) != action.default]


def refuse_with(mode: str, given: Sequence[str]) -> None:
    """UsageError for options `given` beside `mode`, which uses none of them."""
    if given:
        raise UsageError(f"{mode} runs nothing, so {', '.join(given)} cannot apply; drop "
                         f"{'it' if len(given) == 1 else 'them'}")


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
    write_text(out, text)  # whole or not at all, should a signal or an error come half-way
    print(f"wrote {out}")
