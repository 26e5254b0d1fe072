"""Check attention benchmark results against the portable kernel's targets.

    python -m harness.attention_targets results/attention-h200/*.json [--impl pallas] [--out targets.md]

Targets (per cell and per pass, forward and backward separately):
  1. at least as fast as JAX's own Pallas `mha` (`jax_pallas_mha`) at every shape;
  2. within 1.5x the time of the fastest PyTorch SDPA backend at seq >= 1024 in bfloat16.
`check` returns the ratios as data; `render_markdown` writes them up.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.cli import emit

PASSES = ("fwd", "bwd")
SDPA = ("torch_sdpa_flash", "torch_sdpa_efficient", "torch_sdpa_cudnn")
SDPA_BOUND, SDPA_MIN_SEQ = 1.5, 1024


def _cells(rows: list[dict]) -> dict[tuple, dict[str, dict]]:
    out: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        key = (r["dtype"], r["head_dim"], r["seq"], r["causal"])
        out.setdefault(key, {})[r["impl"]] = r
    return out


def check(rows: list[dict], impl: str = "pallas") -> list[dict]:
    """One record per cell x pass with our time over mha's and over the fastest SDPA's
    (None where either side has no number), and whether each target applies and holds."""
    out = []
    for (dtype, head_dim, seq, causal), impls in sorted(_cells(rows).items()):
        ours = impls.get(impl)
        for name in PASSES:
            t = ours.get(f"{name}_ms") if ours and ours["status"] == "ok" else None
            mha = impls.get("jax_pallas_mha")
            mha_t = mha.get(f"{name}_ms") if mha and mha["status"] == "ok" else None
            sdpa = [impls[s][f"{name}_ms"] for s in SDPA if s in impls and impls[s]["status"] == "ok"]
            rec = {"dtype": dtype, "head_dim": head_dim, "seq": seq, "causal": causal, "pass": name,
                   "status": ours["status"] if ours else "not run",
                   "vs_mha": t / mha_t if t and mha_t else None,
                   "vs_sdpa": t / min(sdpa) if t and sdpa else None,
                   "sdpa_target_applies": dtype == "bfloat16" and seq >= SDPA_MIN_SEQ}
            rec["meets_mha"] = None if rec["vs_mha"] is None else rec["vs_mha"] <= 1.0
            rec["meets_sdpa"] = (rec["vs_sdpa"] <= SDPA_BOUND if rec["vs_sdpa"] is not None else None) \
                if rec["sdpa_target_applies"] else None
            out.append(rec)
    return out


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def render_markdown(records: list[dict], sources: list[str], impl: str) -> str:
    def count(key: str) -> str:
        judged = [r for r in records if r[key] is not None]
        return f"{sum(r[key] for r in judged)} of {len(judged)}"

    lines = [f"# `{impl}` against its targets", "", f"From {', '.join(f'`{s}`' for s in sources)}. Ratios are "
             f"time over time (< 1: `{impl}` faster), per cell and pass.", "",
             f"- as fast as JAX Pallas `mha` (ratio <= 1): {count('meets_mha')} cell-passes",
             f"- within {SDPA_BOUND}x of the fastest torch SDPA at seq >= {SDPA_MIN_SEQ}, bf16: "
             f"{count('meets_sdpa')} cell-passes", ""]
    for label, key, bad in (("Slower than JAX Pallas mha", "vs_mha", "meets_mha"),
                            (f"Past {SDPA_BOUND}x of torch SDPA (bf16, seq >= {SDPA_MIN_SEQ})", "vs_sdpa", "meets_sdpa")):
        misses = [r for r in records if r[bad] is False]
        lines += [f"## {label}: {len(misses)}", ""]
        if misses:
            lines += ["| dtype | head_dim | seq | causal | pass | ratio |", "|---|---|---|---|---|---|"]
            lines += [f"| {r['dtype']} | {r['head_dim']} | {r['seq']} | {'yes' if r['causal'] else 'no'} | {r['pass']} "
                      f"| {_fmt(r[key])} |" for r in misses]
            lines.append("")
    lines += ["## Every cell", "", "| dtype | head_dim | seq | causal | pass | vs mha | vs fastest SDPA |",
              "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['dtype']} | {r['head_dim']} | {r['seq']} | {'yes' if r['causal'] else 'no'} | {r['pass']} | "
              f"{_fmt(r['vs_mha'])} | {_fmt(r['vs_sdpa'])} |" for r in records]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.attention_targets", description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+", type=Path, help="JSON files written by harness.bench_attention")
    p.add_argument("--impl", default="pallas")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    rows = []
    for path in args.results:
        try:
            rows += json.loads(path.read_text())["results"]
        except (OSError, ValueError, KeyError) as exc:
            print(f"error: {path}: not a harness.bench_attention result ({exc})", file=sys.stderr)
            return 2
    if not any(r["impl"] == args.impl for r in rows):
        print(f"error: no {args.impl!r} rows in the given results", file=sys.stderr)
        return 2
    text = render_markdown(check(rows, args.impl), [p.name for p in args.results], args.impl)
    emit(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
