"""Command-line options shared by the attention tools (bench_attention, tune_attention)."""

from __future__ import annotations

import argparse

from harness.attention.catalog import DEFAULT_SEQS, DTYPES, LEAD_IN_MS, NONCAUSAL_MIN_SEQ, SHAPE_SETS
from harness.common.cli import choice, comma_list, non_negative_float, non_negative_int, positive_int
from harness.config import DEVICES


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
    p.add_argument("--shapes", choices=SHAPE_SETS, default=shapes,
                   help="grid: --seq x --head-dim at --batch/--heads; fa3: batch*seq=16384, heads*head_dim=2048 "
                        "(--seq filters, None: 1024..16384); leaderboard: 16 x 16384 x 64 causal")
    p.add_argument("--seq", type=comma_list(positive_int), default=None,
                   help=f"comma-separated sequence lengths (None: grid {','.join(map(str, DEFAULT_SEQS))}, "
                        "fa3 1024..16384)")
    p.add_argument("--head-dim", type=comma_list(positive_int), default=None,
                   help="comma-separated (None: grid 64,80,128; fa3 64,128)")
    p.add_argument("--dtype", type=comma_list(choice("dtype", tuple(DTYPES))), default=dtype,
                   help=f"comma-separated: {', '.join(DTYPES)}")
    p.add_argument("--causal", choices=("true", "false", "both"), default="both",
                   help=f"true, false or both ('both' adds non-causal cells for seq >= {NONCAUSAL_MIN_SEQ})")
    p.add_argument("--batch", type=positive_int, default=1, help="grid shapes only")
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


def add_device_arg(p: argparse.ArgumentParser, cpu_means: str) -> None:
    """--device cuda|cpu, default cuda; `cpu_means` says what a CPU run is good for."""
    p.add_argument("--device", type=choice("device", DEVICES), default="cuda",
                   help=f"{', '.join(DEVICES)}; cpu: {cpu_means}")
