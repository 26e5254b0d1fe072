"""AdamW step time: the per-parameter loop against the foreach and fused implementations, one run.

    python -m harness.bench_optimizer --model large --device cuda [--variants loop,foreach,foreach-compiled,fused]

Prints each variant's median step time, achieved bandwidth (and its share of the GPU's
datasheet HBM bandwidth) and speed-up over the loop; `--out` writes the JSON.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from harness.cli.dialect import (
    add_device,
    add_model,
    add_out,
    choice,
    comma_list,
    fail,
    make_parser,
    parse_args,
    positive_int,
    select_platform,
)
from harness.common.errors import UsageError
from harness.common.hardware import hbm_tbps
from harness.common.results import environment, write_json
from harness.config import get_config
from harness.timing.adamw_timing import VARIANTS, bench_optimizer, format_result


def build_parser():
    p = make_parser("harness.bench_optimizer", __doc__)
    add_model(p)
    add_device(p)
    p.add_argument("--variants", type=comma_list(choice("variant", list(VARIANTS))), default=list(VARIANTS),
                   help=f"comma-separated, from {', '.join(VARIANTS)}")
    p.add_argument("--warmup", type=positive_int, default=3, help="untimed steps per variant")
    p.add_argument("--steps", type=positive_int, default=10, help="timed steps per variant, in rotating rounds")
    add_out(p, "write the result JSON here", metavar="PATH.json")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    try:
        select_platform(args)
    except UsageError as exc:
        return fail(str(exc))
    doc = bench_optimizer(get_config(args.model), args.device, args.variants, args.warmup, args.steps)
    device = None
    if args.device == "cuda":
        import torch

        device = torch.cuda.get_device_name()
    doc["env"] = environment({"device": device or "cpu"})
    tbps = hbm_tbps(device)
    print(format_result(doc, tbps * 1e3 if tbps else None))
    if args.out:
        write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
