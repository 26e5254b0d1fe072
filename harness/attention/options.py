"""The attention tools' options: the shared command-line options, and the typed record each
tool builds once from its parsed command line and hands to the library.

bench_attention and tune_attention share the shape and timing options (`add_shape_args`,
`add_timing_args`); everything else comes from the harness's one dialect
(`harness.cli.dialect`). Our kernel family (triton, mosaic) is `--kernel`: `--backend`
names a framework backend of the registry everywhere else. `BenchOptions`, `TuneOptions`
and `OnceOptions` are frozen: the library reads them and never writes into them.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from harness.attention.catalog import (
    DEFAULT_SEQS,
    DTYPES,
    IMPLS,
    KERNEL_PASSES,
    LEAD_IN_MS,
    NONCAUSAL_MIN_SEQ,
    SHAPE_SETS,
    cells,
)
from harness.cli.dialect import choice, comma_list, non_negative_float, non_negative_int, positive_int

CAUSAL = ("true", "false", "both")


def lead_in_ms(value: str) -> float:
    """argparse type of --lead-in-ms (here and in harness.tune_attention):
    milliseconds >= 0, where 0 turns the lead-in off."""
    try:
        ms = float(value)
    except ValueError:
        ms = float("nan")
    if not ms >= 0:
        raise argparse.ArgumentTypeError(f"must be milliseconds >= 0 (0 turns the lead-in off), got {value!r}")
    return ms


def add_shape_args(p: argparse.ArgumentParser, *, shapes: str, dtype: list[str] | str) -> None:
    """The shape options bench_attention and tune_attention share."""
    p.add_argument("--shapes", type=choice("shapes", SHAPE_SETS), default=shapes,
                   help="grid: --seq x --head-dim at --batch/--heads; fa3: batch*seq=16384, heads*head_dim=2048 "
                        "(--seq filters, None: 1024..16384); leaderboard: 16 x 16384 x 64 causal")
    p.add_argument("--seq", type=comma_list(positive_int), default=None,
                   help=f"comma-separated sequence lengths (None: grid {','.join(map(str, DEFAULT_SEQS))}, "
                        "fa3 1024..16384)")
    p.add_argument("--head-dim", type=comma_list(positive_int), default=None,
                   help="comma-separated (None: grid 64,80,128; fa3 64,128)")
    p.add_argument("--dtype", type=comma_list(choice("dtype", tuple(DTYPES))), default=dtype,
                   help=f"comma-separated: {', '.join(DTYPES)}")
    p.add_argument("--causal", type=choice("causal", CAUSAL), default="both",
                   help=f"true, false or both ('both' adds non-causal cells for seq >= {NONCAUSAL_MIN_SEQ})")
    p.add_argument("--batch", type=positive_int, default=1, help="sequences per batch (grid shapes only)")
    p.add_argument("--heads", type=positive_int, default=16, help="grid shapes only")


def add_timing_args(p: argparse.ArgumentParser, *, warmup: int, iters: int) -> None:
    """The timing options bench_attention and tune_attention share."""
    p.add_argument("--warmup", type=non_negative_int, default=warmup, help="untimed calls of each pass before timing")
    p.add_argument("--iters", type=positive_int, default=iters, help="timed repeats per pass (median reported)")
    p.add_argument("--min-batch-ms", type=non_negative_float, default=25.0,
                   help="launches per repeat are chosen so that a repeat lasts at least this long")
    p.add_argument("--lead-in-ms", type=lead_in_ms, default=LEAD_IN_MS,
                   help="untimed calls of the same pass for at least this long before each timed repeat, so the "
                        "clock under a power limit has settled to that pass (0: none)")


class _OldKernelSpelling(argparse.Action):
    """--backend, the old spelling of --kernel, hidden: stores the kernel family and says
    once, on stderr, to use --kernel (--backend names a framework backend elsewhere)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"warning: {option_string} is now --kernel (--backend names a framework backend in the other "
              f"tools); {option_string} {values} still works for now", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_kernel(p: argparse.ArgumentParser, families: tuple[str, ...], default: str, what: str) -> None:
    """--kernel: our kernel family (`pallas_kernels.FAMILIES`, and "auto" where it is a choice);
    the old spelling --backend still works, hidden, with one deprecation line."""
    kind = choice("kernel", families)
    p.add_argument("--kernel", type=kind, default=default, help=f"{what}: {', '.join(families)}")
    p.add_argument("--backend", type=kind, dest="kernel", action=_OldKernelSpelling, default=argparse.SUPPRESS,
                   help=argparse.SUPPRESS)


@dataclasses.dataclass(frozen=True)
class MeasureOptions:
    """What bench_attention and tune_attention measure and how: the shape cells' options
    (`catalog.cells`), the timing (`interleaved.time_interleaved`) and the device."""

    shapes: str
    seq: tuple[int, ...]
    head_dim: tuple[int, ...]
    dtype: tuple[str, ...]
    causal: str
    batch: int
    heads: int
    warmup: int
    iters: int
    min_batch_ms: float
    lead_in_ms: float
    device: str

    def cells(self) -> list[dict]:
        """The shape cells (batch, heads, seq, head_dim, dtype, causal), in measuring order."""
        return cells(self.shapes, self.seq, self.head_dim, self.dtype, self.causal, self.batch, self.heads)

    @classmethod
    def _fields_of(cls, args: argparse.Namespace, **given) -> dict:
        """This record's fields from `args` (lists as tuples), overridden by `given`."""
        out = {}
        for field in dataclasses.fields(cls):
            if field.name in given:
                value = given[field.name]
            elif field.default is dataclasses.MISSING:
                value = getattr(args, field.name)  # a field every tool's parser sets
            else:
                value = getattr(args, field.name, field.default)
            out[field.name] = tuple(value) if isinstance(value, list) else value
        return out


@dataclasses.dataclass(frozen=True)
class BenchOptions(MeasureOptions):
    """harness.bench_attention's options: which implementations (`catalog.IMPLS`), and where
    the results go (`out` None: results/attention/<gpu>/); `render`: results JSON files whose
    .md and .png to rewrite instead of measuring."""

    impl: tuple[str, ...] = IMPLS
    out: Path | None = None
    name: str = "attention"
    render: tuple[Path, ...] = ()

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> BenchOptions:
        return cls(**cls._fields_of(args, out=None if args.out is None else Path(args.out),
                                    render=tuple(args.render or ())))


@dataclasses.dataclass(frozen=True)
class TuneOptions(MeasureOptions):
    """harness.tune_attention's options: the kernel family searched, its passes, the
    candidates kept (`only`: those that set this field), and the .jsonl's folder and stem;
    `render`: a .jsonl to render instead of measuring (the other fields then unresolved)."""

    kernel: str = "mosaic"
    passes: tuple[str, ...] = KERNEL_PASSES
    only: str | None = None
    out: Path | None = None
    name: str = ""
    render: Path | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> TuneOptions:
        name = args.name or ("" if args.head_dim is None else f"{args.kernel}-d{'-'.join(map(str, args.head_dim))}")
        return cls(**cls._fields_of(args, out=None if args.out is None else Path(args.out), name=name))


@dataclasses.dataclass(frozen=True)
class OnceOptions:
    """harness.attention_once's options: one shape, our kernel family ("auto" lets the
    dispatcher choose), and the block sizes with the --blocks overrides applied (None: the
    family's defaults)."""

    kernel: str
    batch: int
    seq: int
    heads: int
    head_dim: int
    dtype: str
    causal: bool
    repeat: int
    device: str
    block_sizes: object = None

    @classmethod
    def from_args(cls, args: argparse.Namespace, block_sizes: object = None) -> OnceOptions:
        return cls(kernel=args.kernel, batch=args.batch, seq=args.seq, heads=args.heads, head_dim=args.head_dim,
                   dtype=args.dtype, causal=args.causal == "true", repeat=args.repeat, device=args.device,
                   block_sizes=block_sizes)
