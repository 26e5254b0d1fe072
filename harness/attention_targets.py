"""Check attention benchmark results against our kernels' targets.

    python -m harness.attention_targets results/attention/portable-h200/*.json [--impl pallas] [--out targets.md]
    python -m harness.attention_targets --targets hopper old.json new.json [--out targets.md]
    python -m harness.attention_targets --targets hopper new.json --baseline old.json   # same kernel, two runs

Files are read oldest first: a cell (shape, dtype, causal) measured in
several is taken whole from the last one (latest_cells).

Portable kernel (`--targets portable`, impl `pallas`), per cell and per pass
(forward and backward separately):
  1. at least as fast as JAX's own Pallas `mha` (`jax_pallas_mha`) at every shape;
  2. within 1.5x the time of the fastest PyTorch SDPA backend at seq >= 1024 in bfloat16.
Hopper kernel (`--targets hopper`, impl `pallas_mosaic`):
  3. per cell, forward and forward+backward each at least the throughput of the
     fastest of every torch SDPA backend and cuDNN through JAX (the backward
     alone is counted apart);
  4. the leaderboard shape (16 x 16384 x 64, causal) forward+backward in at most
     0.95x the fastest reference's time.
`check` / `check_hopper` return the ratios as data; the render functions write them up.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from harness.attention.targets import (
    against_baseline,
    check,
    check_hopper,
    latest_cells,
    render_baseline_markdown,
    render_hopper_markdown,
    targets_markdown,
)
from harness.cli.dialect import add_out, choice, emit, fail, make_parser, parse_args


def _read(paths: Sequence[Path]) -> list[list[dict]]:
    runs = []
    for path in paths:
        try:
            runs.append(json.loads(path.read_text())["results"])
        except (OSError, ValueError, KeyError) as exc:
            raise ValueError(f"{path}: not a harness.bench_attention result ({exc})") from None
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    p = make_parser("harness.attention_targets", __doc__)
    p.add_argument("results", nargs="+", type=Path,
                   help="JSON files written by harness.bench_attention, oldest first: a cell measured in several "
                        "is taken from the last")
    p.add_argument("--targets", type=choice("targets", ("portable", "hopper")), default="portable",
                   help="portable: the Triton-lowered kernel's targets; hopper: the Mosaic GPU kernel's")
    p.add_argument("--impl", default=None, help="the implementation checked (None: pallas for portable, "
                                                "pallas_mosaic for hopper)")
    p.add_argument("--baseline", nargs="+", type=Path, default=[], metavar="JSON",
                   help="earlier results of the same implementation (oldest first): adds its time now over its "
                        "time there, per cell and pass, and whether the two runs' spreads overlap")
    add_out(p, "write the markdown here (None: stdout)", metavar="PATH.md")
    args = parse_args(p, argv)
    args.impl = args.impl or ("pallas" if args.targets == "portable" else "pallas_mosaic")
    try:
        rows, base = latest_cells(_read(args.results)), latest_cells(_read(args.baseline))
    except ValueError as exc:
        return fail(str(exc))
    if not any(r["impl"] == args.impl for r in rows):
        return fail(f"--impl {args.impl}: no {args.impl!r} rows in the given results")
    sources = [p.name for p in args.results]
    if args.targets == "hopper":
        text = render_hopper_markdown(check_hopper(rows, args.impl), sources, args.impl)
    else:
        text = targets_markdown(check(rows, args.impl), sources, args.impl)
    if args.baseline:
        text += render_baseline_markdown(against_baseline(rows, base, args.impl), [p.name for p in args.baseline],
                                         args.impl)
    emit(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
