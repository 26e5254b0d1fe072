"""Kernel-breakdown report: markdown, CSV, JSON and PNG, one column per profile (the
library behind `python -m harness.report`).

Inputs: ``.nsys-rep`` (exported with nsys first), ``.sqlite``/``.sqlite.gz`` exports, or
the framework-profiler fallback's traces (torch ``.json``, JAX ``.xplane.pb``).  Columns
are labelled by the backend named in each file name, or by ``--label``.

From Python (e.g. the compare harness adding a section to its own report)::

    from harness.trace.analyses import breakdown
    from harness.reports import breakdown as render
    bds = [breakdown.breakdown(breakdown.load_profile(p)) for p in paths]
    files = render.write_report(out_dir, bds)          # writes kernels.md/.csv/.json/.png
    section = render.breakdown_markdown(bds)              # or just the markdown text
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

from harness.common.results import atomic_path, write_text
from harness.common.spread import HEADER, MAX_COLUMNS, RULE, capped, spread_cells
from harness.common.tables import markdown_table
from harness.reports.breakdown_text import _ms, _phases, _unit, busy, range_metric, short_names
from harness.reports.plot import plot
from harness.trace.analyses.breakdown import TOP_N, Breakdown, PhaseStats, answers
from harness.trace.kernels import Category, short_name


def _spread_row(phase: str, metric: str, bds: Sequence[Breakdown], cells: Sequence[str]) -> list[str]:
    """A row over many columns: how many have the figure, and its distribution (`spread`)."""
    values = {bd.label: float(c) for bd, c in zip(bds, cells) if c != "-"}
    return [phase, metric, str(len(values)), *(spread_cells(values, prefix="") if values else ["-"] * 5)]


def _header(bds: Sequence[Breakdown], many: bool, first: str) -> list[str]:
    return [first, "metric", *(["profiles", *HEADER] if many else [bd.label for bd in bds])]


def _summary(bds: Sequence[Breakdown], phases: Sequence[str] | None = None, many: bool = False) -> list[str]:
    """Per phase: GPU time (summed over streams), busy time (their union), range time,
    counts; with several device timelines, every GPU figure is per device (their mean).
    `many`: a row's distribution over the columns instead of one column each."""
    rows = []
    several = any(p.devices > 1 for bd in bds for p in bd.phases.values())
    unit = busy(bds)
    metrics = [(f"{unit} ms/step", lambda p: _ms(p.gpu_ns_per_step)),
               (f"{unit} busy ms/step", lambda p: _ms(p.busy_ns_per_step or 0.0)),
               range_metric(bds, many),
               (f"{_unit(bds)}s/step", lambda p: f"{p.kernels_per_step:.1f}")]
    if not all(bd.cpu_ops for bd in bds):  # a CPU profile has no copies of its own
        metrics.append(("memcpys+memsets/step", lambda p: f"{p.copies_per_step:.1f}"))
    if several:
        metrics.insert(0, ("devices", lambda p: str(p.devices)))
    for phase in _phases(bds) if phases is None else phases:
        for metric, get in metrics:
            cells = [get(bd.phases[phase]) if phase in bd.phases else "-" for bd in bds]
            rows.append(_spread_row(phase, metric, bds, cells) if many else [phase, metric, *cells])
    return markdown_table(_header(bds, many, "phase"), rows)


def _categories(bds: Sequence[Breakdown], phases: Sequence[str] | None = None, many: bool = False) -> list[str]:
    """Per phase and category: its share and ms per column (`many`: the ms' distribution)."""
    rows = []
    for phase in _phases(bds) if phases is None else phases:
        for cat in Category:
            if many:
                ms = [_ms(bd.phases[phase].categories.get(cat.value, 0.0)) if phase in bd.phases else "-"
                      for bd in bds]
                if any(c not in ("-", _ms(0.0)) for c in ms):
                    rows.append(_spread_row(phase, f"{cat.value} ms", bds, ms))
                continue
            cells = []
            for bd in bds:
                p = bd.phases.get(phase)
                ns = p.categories.get(cat.value, 0.0) if p else 0.0
                cells.append(f"{p.share(cat):.1%} ({_ms(ns)} ms)" if p and ns else "-")
            if any(c != "-" for c in cells):
                rows.append([phase, cat.value, *cells])
    return markdown_table(["phase", "category", *(["profiles", *HEADER] if many else [bd.label for bd in bds])],
                          rows)


def _top(p: PhaseStats, n: int, unit: str = "kernel") -> list[str]:
    top = p.kernels[:n]
    ops = any(k.ops for k in top)  # JAX with its optimized HLO: what each fusion computes
    rows = [[name, k.category + (f" (from `{k.inferred_from}` range)" if k.inferred_from else ""),
             f"{k.calls_per_step:.1f}", _ms(k.ns_per_step), f"{k.mean_ns / 1e3:.1f}", f"{k.share:.1%}",
             *([k.ops or ""] if ops else [])]
            for name, k in zip(short_names([k.name for k in top]), top)]
    header = [unit, "category", "calls/step", "ms/step", "mean µs", "share", *(["XLA ops"] if ops else [])]
    return markdown_table(header, rows)


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
    unit = _unit([bd])
    if a := ans["a"]:
        timer = f", harness timer {a['reference_ms']:.3f} ms" if a["reference"] == "harness timer" else ""
        reference = "range" if a["reference"] == "NVTX range" else a["reference"]
        out.append(f"- (a) forward, medians over {a['steps']} steps: {unit}s {a['kernel_ms']:.3f} ms, range "
                   f"{a['range_ms']:.3f} ms{timer}; the {reference} exceeds the {unit}s by "
                   f"{a['difference_ms']:.3f} ms ({a['difference_pct']:.1f}%: "
                   f"{'dispatch and Python between ops' if bd.cpu_ops else 'launch gaps, host work, sync'})")
    else:
        out.append("- (a)-(d): no `forward` range in this profile")
    if b := ans["b"]:
        if b["top_in_step"] is None:
            still = "no step range to compare with"
        elif b["top_in_step"]:
            still = f"it is also the top {unit} of the full step"
        else:
            still = (f"over the full step the top {unit} is `{short_name(b['step_top'], 60)}` "
                     f"({b['step_top_share']:.1%})")
        out.append(f"- (b) top forward {unit}: `{short_name(b['name'], 70)}` ({b['category']}, {b['share']:.1%} "
                   f"of forward, {b['calls_per_forward']:.1f} calls per forward); {still}")
    if ans["c"] is not None:
        listed = "; ".join(f"`{short_name(c['name'], 60)}` {c['category']} {c['share']:.1%}" for c in ans["c"])
        out.append(f"- (c) non-GEMM {unit}s with >= 5% of forward: {listed or 'none'}")
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


# What a forward GEMM's transpose says about the product it computes (see `_caption`).
_FORWARD_TRANSPOSES = {"tn": "weights stored [out, in], or Q K^T",
                       "nn": "weights stored [in, out], or P V"}


def _caption(bd: Breakdown) -> str:
    """What the transposes in this profile's GEMM table say about its weight layout."""
    fwd = bd.phases.get("forward")
    seen = sorted({k.gemm.transpose for k in fwd.kernels if k.gemm and k.gemm.transpose}) if fwd else []
    base = ("Transposes are cuBLAS's column-major view of the row-major product: `nn.Linear` (weight "
            "[out, in], `Y = X W^T`) runs forward as `tn`, its backward as `nn` (dX) and `nt` (dW); a weight "
            "stored [in, out] (Flax `Dense`, GPT-2's `Conv1D`: `Y = X W`) runs forward as `nn`; the attention "
            "products run as `tn` (`Q K^T`) and `nn` (`P V`).")
    if not seen:
        return base + " The forward GEMMs here do not name a transpose."
    return base + " Forward GEMMs here: " + ", ".join(f"`{t}` ({_FORWARD_TRANSPOSES.get(t, 'neither layout')})"
                                                      for t in seen) + "."


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
    """The layers that took most busy time (GPU, or CPU for CPU ops) per phase, with their
    share of the phase."""
    rows = []
    for phase, layers in bd.layers.items():
        total = sum(layers.values())
        rows += [[phase, name, _ms(ns), f"{ns / total:.1%}" if total else "-"] for name, ns in list(layers.items())[:n]]
    return markdown_table(["phase", "layer", f"{busy([bd])} ms", "share of phase"], rows)


def _library(bds: Sequence[Breakdown]) -> list[str]:
    """The library ranges inside each phase (`harness.trace.analyses.library`), one table:
    per profile, how many per step, their kernels' time per step and share of the phase."""
    rows = []
    for phase in _phases(bds):
        names: dict[str, str] = {}
        for bd in bds:
            names.update((s.name, s.library) for s in bd.library_ranges.get(phase, ()) if s.name not in names)
        for name, library in names.items():
            cells = []
            for bd in bds:
                s = next((s for s in bd.library_ranges.get(phase, ()) if s.name == name), None)
                cells.append(f"{s.per_step:.4g}, {_ms(s.gpu_ns_per_step)} ms, {s.share:.1%}" if s else "-")
            rows.append([phase, f"`{name}`", library, *cells])
    if not rows:
        return []
    return ["## Library ranges inside each phase", "",
            f"Ranges a framework opens itself are no phases: their {_unit(bds)}s count in the phase that holds them. "
            f"Per profile: ranges per step, {busy(bds)} ms per step of the {_unit(bds)}s launched inside them on their "
            "thread (run inside them, where the profile attributes by execution), share of the phase; `*` stands "
            "for a module index (one row per block's ranges).", "",
            *markdown_table(["phase", "library range", "library", *(bd.label for bd in bds)], rows), ""]


def breakdown_markdown(bds: Sequence[Breakdown], answer_sets: Sequence[dict] | None = None,
                       top_n: int = TOP_N, title: str = "Kernel breakdown", sections: Sequence[str] = (),
                       detail: str = "full", lead: Sequence[str] = ()) -> str:
    """The report as markdown; `answer_sets` default to `answers(bd)` for each breakdown;
    `lead` (markdown lines: the answer) opens it; `sections` (markdown lines, e.g. the
    cross-rank tables) go before the left-out kernels.
    `detail` "summary" keeps it about 300 lines at any number of columns (`_SUMMARY`)."""
    answer_sets = answer_sets or [answers(bd) for bd in bds]
    summary = detail == "summary"
    many = summary and len(bds) > MAX_COLUMNS
    phases = _phases(bds)
    kept = phases[:SUMMARY_PHASES] if summary else phases  # the phases the tables show
    out = [f"# {title}", "", *lead]
    for bd in bds[:1] if many else bds:
        spill = "" if bd.outside_share is None else f"; {bd.outside_share:.1%} of in-range kernel time ran outside"
        out += [f"- **{bd.label}**: `{Path(bd.path).name}` (source: {bd.source}; "
                f"{next(iter(bd.phases.values())).steps} measured steps)"]
        if not summary or bd is bds[0]:  # the summary: the first column's rules (the others' in report.html)
            out += [f"  - steps: {bd.steady_rule}", f"  - attribution: {bd.attribution_reason}{spill}"]
    if many:
        out.append(f"- and {len(bds) - 1} more profiles, {bds[1].label} to {bds[-1].label} (each one's lines: "
                   "report.html)")
    if summary:
        out += ["", _SUMMARY.format(n=MAX_COLUMNS, phases=SUMMARY_PHASES)]
    unit = _unit(bds)
    if unit == "op":
        what = ("CPU ms = sum of the self times of the ops attributed to the range (an op's duration less that "
                "of the ops it calls, so no time counts twice); range ms = the range's own wall time.")
    else:
        what = (f"{busy(bds)} ms = sum of the durations of the kernels, memcpys and memsets attributed to the "
                "range (each profile's attribution rule above), and every table ranks them together; range ms = "
                "the range's own wall time; kernels/step counts kernels only, memcpys+memsets/step the copies.")
    out += ["", "Times are per measured step: a range's totals divided by the number of steps holding it "
            f"(mean over the steps; the steps are as listed above). {what}", ""]
    rest = [f"{len(phases) - len(kept)} more phases in report.html (or `--detail full`): "
            + ", ".join(f"`{p}`" for p in phases[len(kept):][:8]) + (" and more" if len(phases) > len(kept) + 8
                                                                     else "") + ".", ""] if kept != phases else []
    if many:
        rest = [RULE, "", *rest]
    out += ["## Per phase", "", *_summary(bds, kept, many), "", *rest, "## Category shares", "",
            *_categories(bds, kept, many), "", *rest]
    inferred: dict[tuple[str, str, str], dict[str, None]] = {}  # (label, range, category) -> names, in order
    for bd in bds:
        for p in bd.phases.values():
            for k in (k for k in p.kernels if k.inferred_from):
                inferred.setdefault((bd.label, k.inferred_from, k.category), {})[k.name] = None
    if inferred:
        out += [f"Categories inferred from the range {unit}s run in, not from their names:", ""]
        for (label, inside, category), names in inferred.items():
            shown = ", ".join(f"`{n}`" for n in short_names(list(names)[:5], 50))
            more = f" and {len(names) - 5} more" if len(names) > 5 else ""
            out.append(f"- {label}: {len(names)} {unit} name(s) inside `{inside}` are {category} (by name another "
                       f"category): {shown}{more}")
        out.append("")
    out += ["## Answers", ""]
    for bd, ans in list(zip(bds, answer_sets))[:1 if many else None]:
        out += [*_answer_lines(bd, ans), ""]
    for bd in bds[:1] if summary else bds:
        out += [f"## {bd.label}: top {_unit([bd])}s", ""]
        for phase, p in bd.phases.items():
            if not summary or phase in kept[:SUMMARY_TOP_PHASES]:
                out += [f"### {phase}", "", *_top(p, top_n, _unit([bd])), ""]
        if summary:
            continue
        if bd.layers:
            out += [f"### {bd.label}: top layers", "", *_layers(bd, top_n), ""]
        if not bd.cpu_ops and (gemm := _gemms(bd)):  # CPU ops' names decode to nothing
            out += [f"### {bd.label}: GEMM kernels decoded", "", _caption(bd), "", *gemm, ""]
        if bd.api:
            out += [f"### {bd.label}: CUDA API calls (whole profile)", "", *_api(bd), ""]
    out += _library(bds[:1] if many else bds)
    left = [line for bd in bds for line in _left_out(bd)]
    warnings = [f"- {bd.label}: {w}" for bd in bds for w in bd.warnings]
    notes = [f"- {bd.label}: {n}" for bd in bds for n in bd.notes]
    if summary:
        left, warnings, notes = (capped(_once(lines), SUMMARY_LINES, "lines") for lines in (left, warnings, notes))
    out += [*sections, "## Left out of the phases", "", *left]
    if warnings:
        out += ["", "## Warnings", "", *warnings]
    if notes:
        out += ["", "## Notes", "", *notes]
    return "\n".join(out) + "\n"


# What the summary leaves out, said at its top.
_SUMMARY = ("This is the summary (`--detail summary`): beyond {n} columns, each row's distribution over them; "
            "the first {phases} phases; the first column's steps and attribution rules and its top kernels of its "
            "first phases; report.html (and `--detail full`) holds every table.")
SUMMARY_BUDGET = 300  # lines: a longer report is summarized (`bounded_markdown`)
SUMMARY_PHASES = 6  # phases the summary's tables show
SUMMARY_TOP_PHASES = 2  # phases whose top kernels the summary lists (the first column's)
SUMMARY_LINES = 6  # lines each of left-out, warnings and notes


def _once(lines: Sequence[str]) -> list[str]:
    """`- label: text` lines with the same text told once, naming the columns they hold for."""
    by_text: dict[str, list[str]] = {}
    for line in lines:
        label, _, text = line.removeprefix("- ").partition(": ")
        by_text.setdefault(text, []).append(label)
    return [f"- {labels[0]}: {text}" if len(labels) == 1 else
            f"- {labels[0]} and {len(labels) - 1} more ({', '.join(labels[1:4])}{', ...' if len(labels) > 4 else ''})"
            f": {text}" for text, labels in by_text.items()]


def bounded_markdown(bds: Sequence[Breakdown], answer_sets: Sequence[dict], top_n: int,
                     sections: Mapping[str, Sequence[str]], detail: str = "summary",
                     lead: Sequence[str] = ()) -> tuple[str, str]:
    """(the report at `detail`, the full report): `sections` per detail ("summary", "full").
    The summary is the full report where that fits `SUMMARY_BUDGET` lines (besides `lead`,
    the answer, at most a dozen findings) and has at most
    `MAX_COLUMNS` columns (a small report is left whole), else `breakdown_markdown`'s summary."""
    full = breakdown_markdown(bds, answer_sets, top_n, sections=sections["full"], lead=lead)
    if detail == "full" or (len(bds) <= MAX_COLUMNS and full.count("\n") - len(lead) <= SUMMARY_BUDGET):
        return full, full
    return (breakdown_markdown(bds, answer_sets, top_n, sections=sections["summary"], detail="summary", lead=lead),
            full)


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


def breakdown_document(bds: Sequence[Breakdown], answer_sets: Sequence[dict]) -> list[dict]:
    """kernels.json's content: each breakdown with its answers (`stats.breakdowns_of` reads
    it back). The profile's file name only: where it lay (often a temp folder) says nothing.
    A kernel's `ops` is written only where known (JAX with its HLO), a phase's `lead_ns_per_step`
    only where recorded: other documents are as before those fields existed."""
    docs = [{**asdict(bd), "path": Path(bd.path).name, "answers": ans} for bd, ans in zip(bds, answer_sets)]
    for k in (k for doc in docs for phase in doc["phases"].values() for k in phase["kernels"] if k["ops"] is None):
        del k["ops"]
    for phase in (p for doc in docs for p in doc["phases"].values() if p.get("lead_ns_per_step", 0) is None):
        del phase["lead_ns_per_step"]
    return docs


def write_report(out_dir: str | Path, bds: Sequence[Breakdown], answer_sets: Sequence[dict] | None = None,
                 top_n: int = TOP_N, stem: str = "kernels", png: bool = True,
                 sections: Sequence[str] = (), markdown: str | None = None,
                 lead: Sequence[str] = ()) -> dict[str, Path]:
    """Write ``<stem>.md`` (`markdown` where given, e.g. `bounded_markdown`'s), ``.csv``,
    ``.json`` and (with `png`) ``.png`` into `out_dir` (`lead` and `sections` as
    `breakdown_markdown` places them); return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    answer_sets = answer_sets or [answers(bd) for bd in bds]
    paths = {ext: out / f"{stem}.{ext}" for ext in ("md", "csv", "json", *(("png",) if png else ()))}
    write_text(paths["md"], markdown if markdown is not None else breakdown_markdown(bds, answer_sets, top_n,
                                                                                     sections=sections, lead=lead))
    with atomic_path(paths["csv"]) as tmp:
        write_csv(Path(tmp), bds)
    write_text(paths["json"], json.dumps(breakdown_document(bds, answer_sets), indent=1, default=str))
    if png:
        plot(paths["png"], bds, top_n)
    return paths
