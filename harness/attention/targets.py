"""Check attention benchmark results against our kernels' targets (the library behind
`python -m harness.attention_targets`).

Portable kernel (impl `pallas`), per cell and per pass (forward and backward separately):
  1. at least as fast as JAX's own Pallas `mha` (`jax_pallas_mha`) at every shape;
  2. within 1.5x the time of the fastest PyTorch SDPA backend at seq >= 1024 in bfloat16.
Hopper kernel (impl `pallas_mosaic`):
  3. per cell, forward and forward+backward each at least the throughput of the
     fastest of every torch SDPA backend and cuDNN through JAX (the backward
     alone is judged and counted too, apart from the target);
  4. the leaderboard shape (16 x 16384 x 64, causal) forward+backward in at most
     0.95x the fastest reference's time.
`check` / `check_hopper` return the ratios as data; the render functions write them up.
"""

from __future__ import annotations

from harness.attention.catalog import BEST_REF_IMPLS, SDPA_IMPLS
from harness.attention.catalog import KERNEL_PASSES as PASSES
from harness.common.tables import markdown_table

SDPA_BOUND, SDPA_MIN_SEQ = 1.5, 1024
LEADERBOARD = {"batch": 16, "heads": 1, "seq": 16384, "head_dim": 64, "causal": True}
LEADERBOARD_TIME_RATIO = 0.95
# The passes whose every cell the Hopper target judges (the backward is counted apart).
TARGET_PASSES = ("fwd", "fwd_bwd")


def _cell_key(r: dict) -> tuple:
    return r["dtype"], r["head_dim"], r["seq"], r["causal"], r["batch"], r["heads"]


def latest_cells(runs: list[list[dict]]) -> list[dict]:
    """The rows of several runs (oldest first) with each cell taken whole
    from the last run that measured it: a later run's cell replaces every
    implementation's row of that cell, so no cell mixes runs."""
    cells: dict[tuple, list[dict]] = {}
    for rows in runs:
        fresh: dict[tuple, list[dict]] = {}
        for r in rows:
            fresh.setdefault(_cell_key(r), []).append(r)
        cells.update(fresh)
    return [r for rows in cells.values() for r in rows]


def _cells(rows: list[dict]) -> dict[tuple, dict[str, dict]]:
    """Rows by cell (dtype, head_dim, seq, causal, batch, heads), then by impl."""
    out: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        out.setdefault(_cell_key(r), {})[r["impl"]] = r
    return out


def _ms(row: dict | None, name: str) -> float | None:
    return row.get(f"{name}_ms") if row and row["status"] == "ok" else None


def check(rows: list[dict], impl: str = "pallas") -> list[dict]:
    """One record per cell x pass with our time over mha's and over the fastest SDPA's
    (None where either side has no number), and whether each target applies and holds."""
    out = []
    for (dtype, head_dim, seq, causal, _, _), impls in sorted(_cells(rows).items()):
        ours = impls.get(impl)
        for name in PASSES:
            t = _ms(ours, name)
            mha_t = _ms(impls.get("jax_pallas_mha"), name)
            sdpa = [x for x in (_ms(impls.get(s), name) for s in SDPA_IMPLS) if x is not None]
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


def check_hopper(rows: list[dict], impl: str = "pallas_mosaic") -> list[dict]:
    """One record per cell x pass: `speedup` = fastest reference time / our time
    (a throughput ratio; `meets`: >= 1) and which reference was fastest."""
    out = []
    for (dtype, head_dim, seq, causal, batch, heads), impls in sorted(_cells(rows).items()):
        ours = impls.get(impl)
        for name in (*PASSES, "fwd_bwd"):
            t = _ms(ours, name)
            refs = [(_ms(impls.get(r), name), r) for r in BEST_REF_IMPLS]
            refs = [x for x in refs if x[0] is not None]
            best_t, best = min(refs) if refs else (None, None)
            rec = {"dtype": dtype, "head_dim": head_dim, "seq": seq, "causal": causal, "batch": batch,
                   "heads": heads, "pass": name, "status": ours["status"] if ours else "not run",
                   "ms": t, "best_ref": best, "best_ref_ms": best_t,
                   "speedup": best_t / t if t and best_t else None}
            rec["meets"] = None if rec["speedup"] is None else rec["speedup"] >= 1.0
            out.append(rec)
    return out


def leaderboard(records: list[dict]) -> dict | None:
    """The leaderboard cell's forward+backward record with `time_ratio` (our time over the
    fastest reference's) and `meets` = time_ratio <= LEADERBOARD_TIME_RATIO; None where the
    cell, or a reference for it, was not measured."""
    for r in records:
        if r["pass"] == "fwd_bwd" and all(r[k] == v for k, v in LEADERBOARD.items()) and r["speedup"]:
            ratio = r["ms"] / r["best_ref_ms"]
            return {**r, "time_ratio": ratio, "meets": ratio <= LEADERBOARD_TIME_RATIO}
    return None


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _fmt_pass(rec: dict) -> str:
    """A judged pass below its target reads "0.996x below": two decimals alone
    would print a 0.996x miss as 1.00x."""
    if rec["meets"] is False:
        return f"{rec['speedup']:.3f}x below"
    return _fmt(rec["speedup"])


def hopper_answer(records: list[dict]) -> list[str]:
    """The Hopper targets' verdicts as markdown bullets: the cell-passes that meet target 3,
    the backward's count, the leaderboard shape against target 4, and the passes below."""
    def count(passes) -> str:
        judged = [r for r in records if r["pass"] in passes and r["meets"] is not None]
        return f"{sum(r['meets'] for r in judged)} of {len(judged)}"

    lines = [f"- forward and forward+backward each >= 1.0x the fastest reference: {count(TARGET_PASSES)} "
             "cell-passes", f"- the backward alone >= 1.0x: {count(('bwd',))} cells"]
    board = leaderboard(records)
    if board:
        lines.append(f"- leaderboard shape (16 x 16384 x 64, causal) forward+backward: {board['ms']:.2f} ms, "
                     f"{board['time_ratio']:.3f}x the time of the fastest reference ({board['best_ref']} "
                     f"{board['best_ref_ms']:.2f} ms); target <= {LEADERBOARD_TIME_RATIO}x: "
                     f"{'met' if board['meets'] else 'not met'}")
    names = {"fwd": "forward", "bwd": "backward", "fwd_bwd": "forward+backward"}
    below = [f"{names[r['pass']]} of {r['batch']}x{r['heads']}x{r['seq']}x{r['head_dim']}"
             f"{'' if r['causal'] else ' non-causal'} ({_fmt_pass(r)})" for r in records if r["meets"] is False]
    if below:
        lines.append(f"- below: {'; '.join(below)}")
    return lines


def render_hopper_markdown(records: list[dict], sources: list[str], impl: str) -> str:
    lines = [f"# `{impl}` against the Hopper targets", "",
             f"From {', '.join(f'`{s}`' for s in sources)}"
             f"{' (a cell in several: the last)' if len(sources) > 1 else ''}. Speed-up = time of the fastest of "
             f"{', '.join(BEST_REF_IMPLS)} / time of `{impl}` (>= 1: at least as fast), per cell and pass.", "",
             *hopper_answer(records), "",
             "| B | H | seq | D | causal | fwd | bwd | fwd+bwd | fastest reference (fwd / bwd) |",
             "|---|---|---|---|---|---|---|---|---|"]
    by_cell: dict[tuple, dict[str, dict]] = {}
    for r in records:
        by_cell.setdefault((r["head_dim"], r["seq"], not r["causal"], r["batch"], r["heads"]), {})[r["pass"]] = r
    for (head_dim, seq, noncausal, batch, heads), p in sorted(by_cell.items()):
        lines.append(f"| {batch} | {heads} | {seq} | {head_dim} | {'no' if noncausal else 'yes'} | "
                     f"{_fmt_pass(p['fwd'])} | {_fmt_pass(p['bwd'])} | {_fmt_pass(p['fwd_bwd'])} | "
                     f"{p['fwd']['best_ref']} / {p['bwd']['best_ref']} |")
    return "\n".join(lines) + "\n"


def targets_markdown(records: list[dict], sources: list[str], impl: str) -> str:
    def count(key: str) -> str:
        judged = [r for r in records if r[key] is not None]
        return f"{sum(r[key] for r in judged)} of {len(judged)}"

    lines = [f"# `{impl}` against its targets", "", f"From {', '.join(f'`{s}`' for s in sources)}. Ratios are "
             f"time over time (< 1: `{impl}` faster), per cell and pass.", "",
             f"- as fast as JAX Pallas `mha` (ratio <= 1): {count('meets_mha')} cell-passes",
             f"- within {SDPA_BOUND}x of the fastest torch SDPA at seq >= {SDPA_MIN_SEQ}, bf16: "
             f"{count('meets_sdpa')} cell-passes", ""]
    for label, key, bad in (("Slower than JAX Pallas mha", "vs_mha", "meets_mha"),
                            (f"Past {SDPA_BOUND}x of torch SDPA (bf16, seq >= {SDPA_MIN_SEQ})", "vs_sdpa",
                             "meets_sdpa")):
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


def against_baseline(rows: list[dict], baseline: list[dict], impl: str) -> list[dict]:
    """`impl`'s time per cell and pass in `rows` over its time in `baseline`, and whether the
    two runs' spreads (each repeat set's p10-p90, as bench_attention records it) overlap: a
    change of the kernels' code that leaves them overlapping is within run-to-run noise."""
    old = {k: v[impl] for k, v in _cells(baseline).items() if impl in v}
    out = []
    for key, impls in sorted(_cells(rows).items()):
        new, base = impls.get(impl), old.get(key)
        for name in PASSES:
            t, t0 = _ms(new, name), _ms(base, name)
            if t is None or t0 is None:
                continue
            lo, hi = new.get(f"{name}_ms_spread", (t, t))
            lo0, hi0 = base.get(f"{name}_ms_spread", (t0, t0))
            out.append({"dtype": key[0], "head_dim": key[1], "seq": key[2], "causal": key[3], "batch": key[4],
                        "heads": key[5], "pass": name, "ms": t, "baseline_ms": t0, "ratio": t / t0,
                        "overlap": lo <= hi0 and lo0 <= hi})
    return out


def render_baseline_markdown(records: list[dict], sources: list[str], impl: str) -> str:
    """The comparison with a baseline as a markdown section."""
    if not records:
        return f"\n## `{impl}` against the baseline\n\nNo cell measured in both.\n"
    ratios = [r["ratio"] for r in records]
    apart = [r for r in records if not r["overlap"]]
    head = (f"\n## `{impl}` against the baseline\n\nBaseline: {', '.join(f'`{s}`' for s in sources)}. "
            f"Time now / time in the baseline, per cell and pass: {min(ratios):.3f}-{max(ratios):.3f}; "
            f"p10-p90 spreads of the two runs overlap in {len(records) - len(apart)} of {len(records)} "
            "cell-passes" + (" (the others are marked `apart`)." if apart else "."))
    rows = [[r["batch"], r["heads"], r["seq"], r["head_dim"], "yes" if r["causal"] else "no", r["pass"],
             f"{r['baseline_ms']:.3f}", f"{r['ms']:.3f}", f"{r['ratio']:.3f}" + ("" if r["overlap"] else " apart")]
            for r in records]
    table = markdown_table(["B", "H", "seq", "D", "causal", "pass", "baseline ms", "ms", "ratio"], rows)
    return head + "\n\n" + "\n".join(table) + "\n"
