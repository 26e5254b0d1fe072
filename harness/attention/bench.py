"""Attention kernel benchmark: our Pallas FlashAttention kernels against XLA, cuDNN, JAX's
Pallas `mha` and PyTorch SDPA backends (the library behind `python -m harness.bench_attention`).

Ratios are time / time of the fastest PyTorch SDPA backend for the same cell and pass
(measured in the same run), so < 1 means faster than SDPA. The `<pass>_speedup_vs_best`
fields are the other way round, a throughput ratio against the fastest of all SDPA
backends and cuDNN through JAX: >= 1 means at least as fast as the best reference.
"""

from __future__ import annotations

import json
import math
import sys
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

import jax

from harness.attention.bench_answer import RULES, bench_findings
from harness.attention.catalog import (
    BEST_REF_IMPLS,
    GPU_ONLY,
    PASS_FLOP_FACTOR,
    PASSES,
    SDPA_IMPLS,
    TORCH_IMPLS,
    cell_key,
    fwd_flops,
)
from harness.attention.impls import build_jax, build_torch
from harness.attention.interleaved import failure_status, release_memory, time_interleaved
from harness.attention.options import BenchOptions, MeasureOptions
from harness.common import results
from harness.common.answer import answer_markdown
from harness.common.results import atomic_path, write_text
from harness.common.tables import markdown_table

REPO_ROOT = Path(__file__).resolve().parent.parent.parent


class Measured(list):
    """The rows of a benchmark run; `stopped_after`: the number of cells measured completely
    when it was stopped part-way (Ctrl-C, SIGTERM), None when it ran to the end."""

    stopped_after: int | None = None


def measure_cell(cell: dict, impls: Iterable[str], args: BenchOptions) -> list[dict]:
    """Times every pass of every implementation on one cell, their repeats
    interleaved (time_interleaved); one row per implementation, a failure
    (unsupported, OOM, compile error) marking that row only."""
    rows = {impl: {"impl": impl, **cell, "status": "ok"} for impl in impls}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        entries = {}
        try:
            for impl in impls:
                if args.device == "cpu" and impl in GPU_ONLY:
                    rows[impl]["status"] = "unsupported: needs a GPU"
                    continue
                builder = build_torch if impl in TORCH_IMPLS else build_jax
                try:
                    thunks, sync, timer = builder(impl, cell, args.device)
                except Exception as exc:  # noqa: BLE001 -- every failure becomes a marked row
                    rows[impl]["status"] = failure_status(exc, caught)
                    continue
                entries.update({(impl, name): (thunks[name], sync, timer) for name in PASSES})
            timed = time_interleaved(entries, warmup=args.warmup, iters=args.iters, min_batch_ms=args.min_batch_ms,
                                     lead_in_ms=args.lead_in_ms)
            for (impl, name), got in timed.items():
                row = rows[impl]
                if isinstance(got, Exception):
                    if row["status"] == "ok":
                        row["status"] = failure_status(got, caught)
                    continue
                median, lo, hi = got
                row[f"{name}_ms"] = median
                row[f"{name}_ms_spread"] = [lo, hi]
                row[f"{name}_tflops"] = fwd_flops(cell) * PASS_FLOP_FACTOR[name] / (median * 1e-3) / 1e12
        finally:
            entries = thunks = None
            release_memory()
    for row in rows.values():  # a failed pass voids the row's other passes too
        if row["status"] != "ok":
            for name in PASSES:
                for suffix in ("_ms", "_ms_spread", "_tflops"):
                    row.pop(f"{name}{suffix}", None)
    return list(rows.values())


def run_benchmark(args: BenchOptions,
                  measure: Callable[[dict, tuple[str, ...], BenchOptions],
                                    Iterable[dict]] = measure_cell) -> Measured:
    """Measures every requested (cell, impl) with `measure`; returns one dict per pair.

    Stopped part-way (Ctrl-C, or SIGTERM in a tool started from the command
    line, e.g. from a time limit: `harness.started`), it returns the cells measured completely so far, their
    number in the rows' `stopped_after`."""
    rows = Measured()
    device = jax.devices("cpu")[0] if args.device == "cpu" else jax.devices()[0]
    with jax.default_device(device):
        todo, done = args.cells(), 0
        try:
            for cell in todo:
                cell_rows = []
                for row in measure(cell, args.impl, args):
                    cell_rows.append(row)
                    print(_progress_line(row), file=sys.stderr, flush=True)
                rows += cell_rows
                done += 1
        except KeyboardInterrupt:
            rows.stopped_after = done
            print(f"bench_attention: stopped; keeping the {done} cell(s) measured completely "
                  f"(of {len(todo)})", file=sys.stderr, flush=True)
    add_sdpa_ratios(rows)
    add_best_ref_speedups(rows)
    return rows


def _fastest(rows: list[dict], impls: tuple[str, ...]) -> dict[tuple, dict[str, tuple[float, str]]]:
    """Per cell and pass: (time, impl) of the fastest of `impls` that ran."""
    best: dict[tuple, dict[str, tuple[float, str]]] = {}
    for row in rows:
        if row["impl"] in impls and row["status"] == "ok":
            entry = best.setdefault(cell_key(row), {})
            for name in PASSES:
                if row[f"{name}_ms"] < entry.get(name, (math.inf, ""))[0]:
                    entry[name] = (row[f"{name}_ms"], row["impl"])
    return best


def add_sdpa_ratios(rows: list[dict]) -> None:
    """Adds `<pass>_vs_sdpa` = time / fastest SDPA backend's time (per pass)."""
    best = _fastest(rows, SDPA_IMPLS)
    for row in rows:
        for name in PASSES:
            ref = best.get(cell_key(row), {}).get(name)
            ok = row["status"] == "ok" and ref is not None
            row[f"{name}_vs_sdpa"] = row[f"{name}_ms"] / ref[0] if ok else None


def add_best_ref_speedups(rows: list[dict]) -> None:
    """Adds `<pass>_speedup_vs_best` = fastest reference's time / this time
    (a throughput ratio; >= 1 meets the target) and `<pass>_best_ref`, the
    reference that was fastest. References: BEST_REF_IMPLS."""
    best = _fastest(rows, BEST_REF_IMPLS)
    for row in rows:
        for name in PASSES:
            ref = best.get(cell_key(row), {}).get(name)
            ok = row["status"] == "ok" and ref is not None
            row[f"{name}_speedup_vs_best"] = ref[0] / row[f"{name}_ms"] if ok else None
            row[f"{name}_best_ref"] = ref[1] if ref is not None else None


# ----------------------------------------------------------------------------
# Rendering.


def _progress_line(row: dict) -> str:
    desc = (f"{row['impl']:22s} b={row['batch']:<3d} h={row['heads']:<3d} s={row['seq']:<6d} d={row['head_dim']:<4d} "
            f"{row['dtype']:9s} causal={row['causal']!s:5s}")
    if row["status"] != "ok":
        return f"{desc} {row['status']}"
    return f"{desc} " + " ".join(f"{n}={row[f'{n}_ms']:.3f}ms" for n in PASSES)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render_table(rows: list[dict], markdown: bool = False) -> str:
    header = ["impl", "B", "H", "seq", "D", "dtype", "causal", "fwd ms", "bwd ms", "f+b ms", "fwd TFLOP/s",
              "bwd TFLOP/s", "f+b TFLOP/s", "fwd/SDPA", "bwd/SDPA", "f+b/SDPA", "fwd xbest", "bwd xbest",
              "f+b xbest", "status"]
    lines = []
    for row in rows:
        ok = row["status"] == "ok"
        lines.append([
            row["impl"], str(row["batch"]), str(row["heads"]), str(row["seq"]), str(row["head_dim"]), row["dtype"],
            "yes" if row["causal"] else "no",
            *(_fmt(row.get(f"{n}_ms") if ok else None, ".3f") for n in PASSES),
            *(_fmt(row.get(f"{n}_tflops") if ok else None, ".3g") for n in PASSES),
            *(_fmt(row.get(f"{n}_vs_sdpa"), ".2f") for n in PASSES),
            *(_fmt(row.get(f"{n}_speedup_vs_best"), ".2f") for n in PASSES),
            row["status"],
        ])
    if markdown:
        return "\n".join(markdown_table(header, lines))
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:{w}s}}" for w in widths)
    return "\n".join([fmt.format(*header)] + [fmt.format(*line) for line in lines])


def environment(args: MeasureOptions, interleaved: bool = True, stopped_after: int | None = None) -> dict:
    """Machine, versions and the timing method (`interleaved`: a cell's
    implementations took their repeats in rotating rounds); `stopped_after`: see `Measured`."""
    rounds = ("; a cell's implementations and passes take their repeats in rotating rounds" if interleaved
              else "; one configuration timed to completion after another")
    rounds += (f"; each timed repeat follows >= {args.lead_in_ms:g} ms of untimed calls of the same pass"
               if args.lead_in_ms else "; no lead-in before a timed repeat")
    extra = {
        "device": jax.devices()[0].device_kind,
        "stopped_after_cells": stopped_after,
        "jax": jax.__version__,
        "jaxlib": __import__("jaxlib").__version__,
        "flop_convention": "fwd 4*B*H*S^2*D (causal /2); bwd 2.5x fwd; fwd+bwd 3.5x fwd",
        "timing": f"median of {args.iters} repeats after {args.warmup} warm-up calls; each repeat times "
                  f"back-to-back launches lasting >= {args.min_batch_ms:g} ms (CUDA events for PyTorch, "
                  f"block_until_ready for JAX){rounds}",
    }
    for module in ("torch", "triton"):
        try:
            extra[module] = __import__(module).__version__
        except ImportError:
            extra[module] = None
    if extra["torch"]:
        import torch

        extra["torch_cuda"] = torch.version.cuda
        extra["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return results.environment(extra)


def render_plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["dtype"], r["head_dim"], r["causal"]) for r in rows}, key=str)
    cols = min(3, len(groups))
    nrows = math.ceil(len(groups) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.5 * cols, 4 * nrows), squeeze=False)
    for ax, (dtype, head_dim, causal) in zip(axes.flat, groups):
        for impl in dict.fromkeys(r["impl"] for r in rows):
            pts = [(r["seq"], r["fwd_bwd_tflops"]) for r in rows
                   if (r["impl"], r["dtype"], r["head_dim"], r["causal"]) == (impl, dtype, head_dim, causal)
                   and r["status"] == "ok"]
            if pts:
                xs, ys = zip(*sorted(pts))
                ax.plot(xs, ys, marker="o", label=impl, linewidth=2.5 if impl.startswith("pallas") else 1.2)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length")
        ax.set_ylabel("fwd+bwd TFLOP/s")
        ax.set_title(f"{dtype}, head_dim {head_dim}, {'causal' if causal else 'non-causal'}")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def default_out_dir() -> Path:
    name = jax.devices()[0].device_kind if jax.devices()[0].platform == "gpu" else None
    return REPO_ROOT / "results" / "attention" / results.gpu_slug(name)


def write_results(rows: list[dict], args: BenchOptions) -> dict[str, Path]:
    """Writes <name>.json (environment + rows), then <name>.md and <name>.png from it;
    rows of a run stopped part-way (`Measured.stopped_after`) say so in both."""
    out = args.out or default_out_dir()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{args.name}.json"
    env = environment(args, stopped_after=getattr(rows, "stopped_after", None))
    path.write_text(json.dumps({"environment": env, "results": list(rows)}, indent=1) + "\n")
    return {"json": path, **render_results(path)}


def render_results(path: Path, figures: bool = True) -> dict[str, Path]:
    """Writes the .md table and (with `figures`) .png plot of a results JSON next to it,
    each whole or not at all, from the JSON alone (its recorded environment, not this machine's)."""
    data = json.loads(path.read_text())
    env, rows = data["environment"], data["results"]
    paths = {"md": path.with_suffix(".md"), **({"png": path.with_suffix(".png")} if figures else {})}
    meta = "\n".join(f"- {k}: `{env[k]}`" for k in ("device", "jax", "torch", "triton", "git_commit", "command"))
    if env.get("stopped_after_cells") is not None:
        meta += f"\n- **stopped before the end: only the first {env['stopped_after_cells']} cell(s) were measured**"
    answer = "\n".join(answer_markdown(bench_findings(rows), RULES))
    write_text(
        paths["md"],
        f"# Attention benchmark ({env['device']})\n\n{answer}\n{meta}\n- {env['timing']}\n"
        f"- FLOPs: {env['flop_convention']}\n"
        f"- x/SDPA: time divided by the fastest PyTorch SDPA backend's time for the same cell (< 1 is faster)\n"
        f"- xbest: throughput ratio against the fastest of every SDPA backend and cuDNN through JAX "
        f"(fastest reference time / this time; >= 1 is at least as fast)\n\n"
        + render_table(rows, markdown=True) + "\n"
    )
    if figures:
        with atomic_path(paths["png"]) as png:
            render_plot(rows, Path(png))
    return paths
