"""Kernel-breakdown report: markdown, CSV, JSON and PNG, one column per profile (the
library behind `python -m harness.report`).

Inputs: ``.nsys-rep`` (exported with nsys first), ``.sqlite``/``.sqlite.gz`` exports, or
the framework-profiler fallback's traces (torch ``.json``, JAX ``.xplane.pb``).  Columns
are labelled by the backend named in each file name, or by ``--label``.

From Python (e.g. the compare harness adding a section to its own report)::

    from harness.trace.analyses import breakdown
    from harness.trace import render
    bds = [breakdown.breakdown(breakdown.load_profile(p)) for p in paths]
    files = render.write_report(out_dir, bds)          # writes kernels.md/.csv/.json/.png
    section = render.breakdown_markdown(bds)              # or just the markdown text
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from harness.common.tables import markdown_table
from harness.trace.analyses.breakdown import Breakdown, PhaseStats, answers
from harness.trace.kernels import Category

TOP_N = 10
NAME_WIDTH = 90
# One colour per category in every plot, whatever categories a plot shows.
CATEGORY_COLORS = dict(zip(Category, ("#1f77b4", "#d62728", "#9467bd", "#8c564b", "#2ca02c", "#17becf",
                                      "#ff7f0e", "#e377c2", "#bcbd22", "#c7c7c7", "#393b79", "#7f7f7f")))


def short_name(name: str, width: int = NAME_WIDTH) -> str:
    """A kernel name fit for a table: no ``void``, no argument list, at most `width` chars.
    Bracketed placeholders (``[CUDA graph: ...]``, ``[CUDA memcpy]``) stay whole."""
    if name.startswith("["):
        return name
    name = name.removeprefix("void ")
    depth = 0
    for i, ch in enumerate(name):  # cut at the argument list: the first "(" outside <...>
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0 and i:
            name = name[:i]
            break
    name = name.replace("|", "\\|")
    return name if len(name) <= width else name[: width - 1] + "…"


def short_names(names: Sequence[str], width: int = NAME_WIDTH) -> list[str]:
    """`short_name` of each name, kept distinct: names that shorten alike keep their head and
    their tail (where template arguments differ), and any still alike are numbered."""
    out = [short_name(n, width) for n in names]
    for short in {s for s in out if out.count(s) > 1}:
        for i in (i for i, s in enumerate(out) if s == short):
            full = short_name(names[i], 10**6)
            half = max(width // 2 - 1, 8)
            out[i] = full if len(full) <= width else full[:half] + "…" + full[-half:]
    for short in {s for s in out if out.count(s) > 1}:
        for k, i in enumerate([i for i, s in enumerate(out) if s == short], 1):
            out[i] = f"{short} #{k}"
    return out


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f}"


def _phases(bds: Sequence[Breakdown]) -> list[str]:
    seen: list[str] = []
    for bd in bds:
        seen += [p for p in bd.phases if p not in seen]
    return seen


def _summary(bds: Sequence[Breakdown]) -> list[str]:
    rows = []
    for phase in _phases(bds):
        for metric, get in (("GPU ms/step", lambda p: _ms(p.gpu_ns_per_step)),
                            ("range ms/step", lambda p: _ms(p.range_ns_per_step)),
                            ("kernels/step", lambda p: f"{p.kernels_per_step:.1f}"),
                            ("memcpys+memsets/step", lambda p: f"{p.copies_per_step:.1f}")):
            rows.append([phase, metric, *(get(bd.phases[phase]) if phase in bd.phases else "-" for bd in bds)])
    return markdown_table(["phase", "metric", *(bd.label for bd in bds)], rows)


def _categories(bds: Sequence[Breakdown]) -> list[str]:
    rows = []
    for phase in _phases(bds):
        for cat in Category:
            cells = []
            for bd in bds:
                p = bd.phases.get(phase)
                ns = p.categories.get(cat.value, 0.0) if p else 0.0
                cells.append(f"{p.share(cat):.1%} ({_ms(ns)} ms)" if p and ns else "-")
            if any(c != "-" for c in cells):
                rows.append([phase, cat.value, *cells])
    return markdown_table(["phase", "category", *(bd.label for bd in bds)], rows)


def _top(p: PhaseStats, n: int) -> list[str]:
    top = p.kernels[:n]
    rows = [[name, k.category + (f" (from `{k.inferred_from}` range)" if k.inferred_from else ""),
             f"{k.calls_per_step:.1f}", _ms(k.ns_per_step), f"{k.mean_ns / 1e3:.1f}", f"{k.share:.1%}"]
            for name, k in zip(short_names([k.name for k in top]), top)]
    return markdown_table(["kernel", "category", "calls/step", "ms/step", "mean µs", "share"], rows)


def _gemms(bd: Breakdown) -> list[str]:
    rows = []
    for phase, p in bd.phases.items():
        if phase in ("step", "fused_step"):
            continue
        gemms = [k for k in p.kernels if k.gemm]
        rows += [[phase, name, k.gemm.arch or "?", k.gemm.math or "?", k.gemm.transpose or "?",
                  k.gemm.tile or "?", _ms(k.ns_per_step)]
                 for name, k in zip(short_names([k.name for k in gemms], 70), gemms)]
    return markdown_table(["phase", "GEMM kernel", "arch", "math", "transpose", "tile", "ms/step"],
                          rows) if rows else []


def _answer_lines(bd: Breakdown, ans: dict) -> list[str]:
    out = [f"### {bd.label}"]
    if a := ans["a"]:
        timer = f", harness timer {a['reference_ms']:.3f} ms" if a["reference"] == "harness timer" else ""
        out.append(f"- (a) forward, medians over {a['steps']} steps: kernels {a['kernel_ms']:.3f} ms, NVTX range "
                   f"{a['range_ms']:.3f} ms{timer}; the {a['reference']} exceeds the kernels by "
                   f"{a['difference_ms']:.3f} ms ({a['difference_pct']:.1f}%: launch gaps, host work, sync)")
    else:
        out.append("- (a)-(d): no `forward` range in this profile")
    if b := ans["b"]:
        if b["top_in_step"] is None:
            still = "no step range to compare with"
        elif b["top_in_step"]:
            still = "it is also the top kernel of the full step"
        else:
            still = (f"over the full step the top kernel is `{short_name(b['step_top'], 60)}` "
                     f"({b['step_top_share']:.1%})")
        out.append(f"- (b) top forward kernel: `{short_name(b['name'], 70)}` ({b['category']}, {b['share']:.1%} "
                   f"of forward, {b['calls_per_forward']:.1f} calls per forward); {still}")
    if ans["c"] is not None:
        listed = "; ".join(f"`{short_name(c['name'], 60)}` {c['category']} {c['share']:.1%}" for c in ans["c"])
        out.append(f"- (c) non-GEMM kernels with >= 5% of forward: {listed or 'none'}")
    if d := ans["d"]:
        grew = [g for g in d["growth"] if g["step_share"] > g["forward_share"] + 0.005][:4]
        listed = ", ".join(f"{g['category']} {g['forward_share']:.1%} -> {g['step_share']:.1%}" for g in grew)
        out.append(f"- (d) GEMM share: forward {d['gemm_forward_share']:.1%}, full step ({d['step']}) "
                   f"{d['gemm_step_share']:.1%}; shares that grew: {listed or 'none'}")
    if e := ans["e"]:
        ms = e["ms_per_step"]
        line = (f"- (e) attention: QK^T {ms['attn_scores']:.3f} ms, softmax {ms['attn_softmax']:.3f} ms, "
                f"PV {ms['attn_values']:.3f} ms per step; softmax/matmuls time ratio "
                f"{e['softmax_to_matmuls_time']:.2f}")
        if "softmax_to_matmuls_flops" in e:
            t = e["tflops"]
            line += (f" vs FLOP ratio {e['softmax_to_matmuls_flops']:.3f} (QK^T, PV: 2*B*H*T^2*Dh each; softmax "
                     f"taken as 5*B*H*T^2); achieved TFLOP/s: QK^T {t['attn_scores']:.2f}, "
                     f"softmax {t['attn_softmax']:.3f}, PV {t['attn_values']:.2f}")
        out.append(line)
    elif ans.get("e_missing"):
        out.append(f"- (e) not answered: {ans['e_missing']}")
    return out


def _caption(bd: Breakdown) -> str:
    """What the transposes in this profile's GEMM table say about its weight layout."""
    fwd = bd.phases.get("forward")
    seen = sorted({k.gemm.transpose for k in fwd.kernels if k.gemm and k.gemm.transpose}) if fwd else []
    base = ("Transposes are cuBLAS's column-major view of the row-major product: `nn.Linear` (weight "
            "[out, in], `Y = X W^T`) runs forward as `tn`, its backward as `nn` (dX) and `nt` (dW); a weight "
            "stored [in, out] (Flax `Dense`, GPT-2's `Conv1D`: `Y = X W`) runs forward as `nn`.")
    if not seen:
        return base + " The forward GEMMs here do not name a transpose."
    layout = ("[out, in] (nn.Linear)" if "tn" in seen else "[in, out] (Dense/Conv1D) or attention products"
              if "nn" in seen else "neither layout by itself")
    return base + f" Forward GEMMs here: {', '.join(f'`{t}`' for t in seen)}, i.e. weights stored {layout}."


def _api(bd: Breakdown) -> list[str]:
    groups: dict[str, list[int]] = {}
    for a in bd.api:
        groups.setdefault(a.group, [0, 0])
        groups[a.group][0] += a.count
        groups[a.group][1] += a.total_ns
    rows = [[g, f"{c}", _ms(t), f"{t / c / 1e3:.1f}" if c else "-",
             ", ".join(f"{a.name} {a.count}" for a in bd.api if a.group == g)[:110]]
            for g, (c, t) in sorted(groups.items(), key=lambda kv: -kv[1][1])]
    return markdown_table(["API calls", "count", "total ms", "mean µs", "functions (count)"], rows)


def _left_out(bd: Breakdown) -> list[str]:
    out = []
    for what, b in (("warm-up", bd.warmup), ("first step (compilation, allocation, autotuning)", bd.first_step),
                    ("first instance only (ran in no later step: autotuning candidates, one-off setup)",
                     bd.first_only),
                    ("autotuning (XLA compile-time)", bd.autotuning),
                    ("outside every measured step", bd.unattributed)):
        if b.count:
            where = ", ".join(f"{k} {_ms(v)} ms" for k, v in b.ranges.items())
            names = "; ".join(f"`{n}`" for n in short_names(b.names[:3], 60))
            out.append(f"- {bd.label}: {what}: {b.count} records, {_ms(b.ns)} ms in all ({where}); top: {names}")
    return out


def _layers(bd: Breakdown, n: int) -> list[str]:
    """The layers that took most GPU time per phase, with their share of the phase."""
    rows = []
    for phase, layers in bd.layers.items():
        total = sum(layers.values())
        rows += [[phase, name, _ms(ns), f"{ns / total:.1%}" if total else "-"] for name, ns in list(layers.items())[:n]]
    return markdown_table(["phase", "layer", "GPU ms", "share of phase"], rows)


def breakdown_markdown(bds: Sequence[Breakdown], answer_sets: Sequence[dict] | None = None,
                    top_n: int = TOP_N, title: str = "Kernel breakdown") -> str:
    """The report as markdown; `answer_sets` default to `answers(bd)` for each breakdown."""
    answer_sets = answer_sets or [answers(bd) for bd in bds]
    out = [f"# {title}", ""]
    for bd in bds:
        spill = "" if bd.outside_share is None else f"; {bd.outside_share:.1%} of in-range kernel time ran outside"
        out += [f"- **{bd.label}**: `{Path(bd.path).name}` (source: {bd.source}; "
                f"{next(iter(bd.phases.values())).steps} measured steps)",
                f"  - steps: {bd.steady_rule}",
                f"  - attribution: {bd.attribution_reason}{spill}"]
    out += ["", "Times are per measured step: a range's totals divided by the number of steps holding it "
            "(mean over the steps; the steps are as listed above). GPU ms = sum of kernel durations "
            "attributed to the range (each profile's attribution rule above); range ms = the range's own "
            "wall time. Memcpys and memsets are counted apart from kernels.", ""]
    out += ["## Per phase", "", *_summary(bds), "", "## Category shares", "", *_categories(bds), ""]
    inferred = [f"- {bd.label}, {p.phase}: `{short_name(k.name, 60)}` is {k.category} because it runs inside "
                f"`{k.inferred_from}` (by name: another category)"
                for bd in bds for p in bd.phases.values() for k in p.kernels if k.inferred_from]
    if inferred:
        out += ["Categories inferred from the range a kernel runs in, not from its name:", "",
                *inferred[:12], *(["- ..."] if len(inferred) > 12 else []), ""]
    out += ["## Answers", ""]
    for bd, ans in zip(bds, answer_sets):
        out += [*_answer_lines(bd, ans), ""]
    for bd in bds:
        out += [f"## {bd.label}: top kernels", ""]
        for phase, p in bd.phases.items():
            out += [f"### {phase}", "", *_top(p, top_n), ""]
        if bd.layers:
            out += [f"### {bd.label}: top layers", "", *_layers(bd, top_n), ""]
        if gemm := _gemms(bd):
            out += [f"### {bd.label}: GEMM kernels decoded", "", _caption(bd), "", *gemm, ""]
        if bd.api:
            out += [f"### {bd.label}: CUDA API calls (whole profile)", "", *_api(bd), ""]
    out += ["## Left out of the phases", "", *(line for bd in bds for line in _left_out(bd))]
    warnings = [f"- {bd.label}: {w}" for bd in bds for w in bd.warnings]
    notes = [f"- {bd.label}: {n}" for bd in bds for n in bd.notes]
    if warnings:
        out += ["", "## Warnings", "", *warnings]
    if notes:
        out += ["", "## Notes", "", *notes]
    return "\n".join(out) + "\n"


def write_csv(path: Path, bds: Sequence[Breakdown]) -> None:
    """One row per (profile, phase, kernel name)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["label", "source", "phase", "steps", "phase_gpu_ms_per_step", "kernel", "category",
                    "calls_per_step", "ms_per_step", "mean_us", "share"])
        for bd in bds:
            for phase, p in bd.phases.items():
                for k in p.kernels:
                    w.writerow([bd.label, bd.source, phase, p.steps, p.gpu_ns_per_step / 1e6, k.name, k.category,
                                k.calls_per_step, k.ns_per_step / 1e6, k.mean_ns / 1e3, k.share])


def plot(path: Path, bds: Sequence[Breakdown], top_n: int = TOP_N) -> None:
    """Stacked category bars per profile x phase (left) and each profile's top kernels of
    its step (right)."""
    from matplotlib.figure import Figure  # not pyplot: no GUI backend, and half the import time

    fig = Figure(figsize=(7 + 6 * len(bds), 6))
    axes = fig.subplots(1, 1 + len(bds), squeeze=False)
    ax = axes[0][0]
    bars = [(f"{bd.label}\n{ph}", p) for bd in bds for ph, p in bd.phases.items()]
    bottom = [0.0] * len(bars)
    for cat in Category:
        vals = [p.categories.get(cat.value, 0.0) / 1e6 for _, p in bars]
        if any(vals):
            ax.bar(range(len(bars)), vals, bottom=bottom, label=cat.value, color=CATEGORY_COLORS[cat])
            bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(range(len(bars)), [b for b, _ in bars], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("GPU ms per step")
    ax.set_title("kernel time by category")
    ax.legend(fontsize=7)
    for ax, bd in zip(axes[0][1:], bds):
        p = next(iter(bd.phases.values()))
        top = p.kernels[:top_n][::-1]
        ax.barh(range(len(top)), [k.ns_per_step / 1e6 for k in top],
                color=[CATEGORY_COLORS[Category(k.category)] for k in top])
        ax.set_yticks(range(len(top)), short_names([k.name for k in top], 45), fontsize=6)
        ax.set_xlabel("ms per step")
        ax.set_title(f"{bd.label}: top kernels ({p.phase})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_report(out_dir: str | Path, bds: Sequence[Breakdown], answer_sets: Sequence[dict] | None = None,
                 top_n: int = TOP_N, stem: str = "kernels", png: bool = True) -> dict[str, Path]:
    """Write ``<stem>.md``, ``.csv``, ``.json`` and (with `png`) ``.png`` into `out_dir`;
    return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    answer_sets = answer_sets or [answers(bd) for bd in bds]
    paths = {ext: out / f"{stem}.{ext}" for ext in ("md", "csv", "json", *(("png",) if png else ()))}
    paths["md"].write_text(breakdown_markdown(bds, answer_sets, top_n))
    write_csv(paths["csv"], bds)
    # The profile's file name only: where it lay (often a temp folder) says nothing.
    doc = [{**asdict(bd), "path": Path(bd.path).name, "answers": ans} for bd, ans in zip(bds, answer_sets)]
    paths["json"].write_text(json.dumps(doc, indent=1, default=str))
    if png:
        plot(paths["png"], bds, top_n)
    return paths
