"""Rendering of a compare summary: terminal table, markdown report, phase bar chart."""

from __future__ import annotations

import re

from harness.backends import all_backends
from harness.common.answer import answer_markdown
from harness.common.documents import RunDocument, runs_of
from harness.common.stats import cell, figure
from harness.common.tables import markdown_table
from harness.reports.compare_answer import RULES, attribution_note, compare_findings, noise_warnings, parity_verdict
from harness.reports.run import format_data_parallel, other_warnings, outlier_lines


def _ms(p: dict | None) -> str:
    return cell(p) if p else "-"


def _tf(p: dict | None) -> str:
    return figure(p.get("tflops")) if p else "-"


def _mfu(p: dict | None) -> str:
    return f"{100 * p['mfu']:.1f}%" if p and p.get("mfu") else "-"


def _mem(p: dict | None) -> str:
    return f"{p['peak_memory_bytes'] / 2**30:.2f}" if p and p.get("peak_memory_bytes") else "-"


def _ratio(x: float | None) -> str:
    return f"{x:.2f}x" if x else "-"


def _on_cpu(summary: dict) -> bool:
    return (summary.get("device") or summary["options"]["device"]) == "cpu"


def precision_text(r: RunDocument, cpu: bool) -> str:
    """The run's precision in words; on a CPU without what only a GPU has (TF32, cuDNN)."""
    if not cpu:
        return r["precision"]
    text = re.sub(r"\s*\([^)]*TF32[^)]*\)", "", r["precision"])
    kept = [part for part in text.split("; ") if "TF32" not in part and "cuDNN" not in part]
    tf32 = r.options.get("dtype") == "tf32"
    return "; ".join(kept + (["a CPU has no TF32: matmuls run in float32"] if tf32 else []))


def _memory_text(r: RunDocument) -> str:
    """How the run measured its peak memory, or that it measured none."""
    if any(p.get("peak_memory_bytes") for p in r.phases.values()):
        return f"Memory: {r['memory_note']}."
    return "Memory: no peak measured (no device allocator on a CPU)." if r["env"].get("device") == "cpu" else \
        "Memory: no peak recorded."


def _ranks(r: RunDocument | None) -> int:
    """The ranks whose phases a run timed apart (torch data parallel); 1 otherwise."""
    return len(((r or {}).get("data_parallel") or {}).get("ranks") or [None])


def _failures(summary: dict) -> list[str]:
    return [f"{b}: FAILED: {r.message}" for b, r in runs_of(summary).items() if not r.ok]


def _drop_empty_groups(rows: list[list[str]], keep: int, size: int) -> list[list[str]]:
    """`rows` without the groups of `size` columns (after the first `keep`) whose cells are
    all "-": a figure no backend has (MFU off the peak table, memory on a CPU)."""
    groups = [range(i, i + size) for i in range(keep, len(rows[0]), size)]
    cols = [*range(keep), *(i for g in groups if any(r[i] != "-" for r in rows[1:] for i in g) for i in g)]
    return [[r[i] for i in cols] for r in rows]


def _step_only() -> str:
    """The frameworks whose backends have no fused step, whose `step` stands in the fused_step
    row (`Backend.framework_name`): "torch"."""
    return ", ".join(dict.fromkeys(b.framework_name for b in all_backends() if not b.fused_step))


def table_rows(summary: dict) -> list[list[str]]:
    """Phase rows with a column per backend for each figure; ratios over the first backend.
    A figure no backend has in any row (MFU off the peak table, memory on a CPU) is left out."""
    runs = runs_of(summary)
    backends = list(runs)
    ref = backends[0] if backends else None
    who = {b: f"{b} rank 0" if _ranks(runs[b]) > 1 else b for b in backends}  # the others' step: data-parallel lines
    header = ["phase", *(f"{who[b]} ms (median, p10-p90)" for b in backends), *(f"{b}/{ref}" for b in backends[1:]),
              *(f"{b} TFLOP/s" for b in backends), *(f"{b} MFU" for b in backends),
              *(f"{b} peak GiB" for b in backends)]
    if (summary.get("data_parallel") or {}).get("n", 1) > 1:
        per = " per device"
        header = [h.replace(" TFLOP/s", " TFLOP/s" + per).replace(" MFU", " MFU" + per) for h in header]
    rows = [header]
    firsts = {b: r.get("first_step") for b, r in runs.items() if r.ok}
    for row in summary["table"]:
        cells = [row.get(b) for b in backends]
        label = row["phase"] + (f" ({_step_only()}: step)" if row["phase"] == "fused_step" else "")
        rows.append([label, *map(_ms, cells), *(_ratio(row["ratios"].get(b)) for b in backends[1:]),
                     *map(_tf, cells), *map(_mfu, cells), *map(_mem, cells)])
    if any(firsts.values()):
        ttfs = [firsts.get(b)["time_to_first_step_ms"] / 1e3 if firsts.get(b) else None for b in backends]
        rows.append(["time to first step (s)", *(f"{x:.2f}" if x else "-" for x in ttfs),
                     *(_ratio(x / ttfs[0] if x and ttfs[0] else None) for x in ttfs[1:]),
                     *["-"] * (3 * len(backends))])
    return _drop_empty_groups(rows, 1 + len(backends) + len(backends[1:]), len(backends))


def _notes(summary: dict) -> list[str]:
    """Overhead, outlier steps and warnings of every run, one line each."""
    lines = []
    for backend, r in runs_of(summary).items():
        if not r.ok:
            continue
        ov = r.get("overhead")
        if ov:
            rr = ov.get("round_ratios") or [ov["ratio"]]
            flag = f" ({ov['flag']})" if ov.get("flag") else ""
            lines.append(f"{backend}: instrumented step / plain step = {ov['ratio']:.3f} "
                         f"(rounds {min(rr):.3f}-{max(rr):.3f}){flag}")
        if (layers := r.get("layer_ranges")) and layers.get("overhead_ratio"):
            flag = f" ({layers['flag']})" if layers.get("flag") else ""
            lines.append(f"{backend}: layer ranges: {layers['overhead_ratio']:.3f}x the step without them{flag}")
        lines += [f"{backend}: {line}" for line in outlier_lines(r)]
        lines += [f"{backend}: warning: {w}" for w in other_warnings(r)]
    return lines


def format_table(summary: dict) -> str:
    o = summary["options"]
    rows = table_rows(summary)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"{o['model']} ctx {o['ctx']} batch {o['batch']} {o['dtype']} attention {o['attention']} "
             f"{o['mode']} on {summary.get('device') or o['device']}"]
    lines += [f"warning: {note}" for note in [attribution_note(summary)] if note]
    lines += ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines += [f"warning: {line}" for line in noise_warnings(summary)]
    lines += _failures(summary)
    lines += _notes(summary)
    lines.append(f"parity: {parity_verdict(summary['parity'])}")
    if summary.get("kernel_breakdown_error"):
        lines.append(f"kernel breakdown: FAILED: {summary['kernel_breakdown_error']}")
    return "\n".join(lines)


def _share(x: float | None) -> str:
    return f"{100 * x:.1f}%" if x is not None else "-"


def data_parallel_lines(summary: dict) -> list[str]:
    """The data-parallel section of report.md: each run's global step and per-rank spread,
    then, from a profiled run, per backend, rank and device the communication kernel time,
    the part hidden under compute on other streams and the exposed rest (`summary["overlap"]`,
    from `harness.trace.analyses.overlap`). Empty for a one-device comparison."""
    runs = {b: r for b, r in runs_of(summary).items() if r.ok and r.get("data_parallel")}
    if not runs and not summary.get("overlap"):
        return []
    out = ["## Data parallel", ""]
    for backend, r in runs.items():
        first, *rest = format_data_parallel(r)
        out += [f"- **{backend}**: {first}", *(f"  - {line.strip()}" for line in rest)]
    out.append("")
    overlap = summary.get("overlap") or {}
    if not overlap:
        return out
    rows = []
    for backend, a in overlap.items():
        for r in a["ranks"]:
            rows += [[backend, r["rank"], d["device"], f"{d['communication_ms']:.3f}", f"{d['hidden_ms']:.3f}",
                      f"{d['exposed_ms']:.3f}", _share(d["hidden_share"])] for d in r["overlap"]]
        rows.append([f"**{backend}, all**", "", "", f"{a['communication_ms']:.3f}", f"{a['hidden_ms']:.3f}",
                     f"{a['exposed_ms']:.3f}", _share(a["hidden_share"])])
    out += ["### Communication hidden under compute", ""]
    out += markdown_table(["backend", "rank", "device", "communication ms", "hidden ms", "exposed ms", "hidden"], rows)
    exposed = "; ".join(f"{b} {_share(1 - a['hidden_share'])}" for b, a in overlap.items()
                        if a["hidden_share"] is not None)
    out += per_step_table(summary)
    out += split_lines(summary)
    out += ["", "Communication kernels (NCCL's, XLA's collectives) summed over the measured steps of each rank's "
            "profile: hidden is the part of a stream's communication that runs while compute kernels run on "
            "the device's other streams, exposed the rest, which the step waits for."
            + (f" Exposed share of the communication: {exposed}." if exposed else ""), ""]
    return out


def per_step_table(summary: dict) -> list[str]:
    """Per backend and kind of step: the communication and exposed time of the mean step
    and the exposed share of the step (`harness.trace.analyses.overlap.per_step_exposure`;
    a folder made before it has the figures for torch's one kind of step only)."""
    from harness.trace.analyses.overlap import per_step_exposure, skewed, worst_text

    rows, mixed, driven = [], [], []
    for backend, a in (summary.get("overlap") or {}).items():
        per = a.get("per_step") or per_step_exposure(a, (summary.get("options") or {}).get("steps"))
        if not per:
            mixed.append(backend)
        for name, p in per.items():
            median = p.get("exposed_median_ms")
            rows.append([backend, name, p["devices"], f"{p['communication_ms']:.3f}", f"{p['exposed_ms']:.3f}",
                         f"{p['exposed_max_ms']:.3f}", "-" if median is None else f"{median:.3f}",
                         f"{p['step_ms']:.3f}", _share(p["exposed_share_of_step"])])
            if skewed(p):
                driven.append(f"- {backend}: {worst_text(name, p)}.")
    out = []
    if rows:
        out += ["", "Exposed communication per step, the mean over devices (and the device that waits longest; the "
                "median step's, each device's median averaged), against the step's median:", ""]
        out += markdown_table(["backend", "step", "devices", "communication ms/step", "exposed ms/step",
                               "most exposed ms/step", "median step exposed ms", "step ms",
                               "exposed share of the step"], rows)
        if driven:
            out += ["", *driven]
    if mixed:
        out += ["", f"{', '.join(mixed)}: no per-step figures; this folder was made before they were kept, and its "
                "totals sum the split and fused steps together (JAX) or do not say how many steps they cover."]
    return out


def split_lines(summary: dict) -> list[str]:
    """Per backend, communication split into transfer and waiting on each rank (JAX: each
    device), bandwidth per collective kind against the link measured in the run, and the
    rank that arrived last (`harness.trace.analyses.collectives`)."""
    from harness import backends
    from harness.trace.analyses.collectives import collective_bytes, format_split, with_sizes

    out = []
    for backend, a in (summary.get("overlap") or {}).items():
        if a.get("split"):
            run = summary["runs"].get(backend, {})
            link = (run.get("data_parallel") or {}).get("link")
            record = backends.get(backend)
            split = with_sizes(a["split"], collective_bytes(run, record.gathers_parameters, record.bf16_gradient_sums))
            out += ["", f"### {backend}: transfer and waiting", "", "```", *format_split(split, link), "```"]
    if out:
        out += ["", "Each collective aligned across ranks (the k-th of its kind on each): the part of a rank's "
                "collective before the last rank's starts is waiting for that rank, the rest transfer."]
    return out


def compare_markdown(summary: dict, kernels: str | None = None) -> str:
    """The compare report; `kernels`, the kernel breakdown's own report, becomes its last section."""
    o = summary["options"]
    runs = runs_of(summary)
    out = [f"# {o['model']}, ctx {o['ctx']}, batch {o['batch']}, {o['dtype']}, attention {o['attention']}, "
           f"{o['mode']} on {summary.get('device') or o['device']}", ""]
    out += answer_markdown(compare_findings(summary), RULES)
    if note := attribution_note(summary):
        out += [f"**{note[0].upper()}{note[1:]}.**", ""]
    failures = _failures(summary)
    if failures:
        out += ["**Failed runs** (no timings are shown for them):", ""] + [f"- {f}" for f in failures] + [""]
    rows = table_rows(summary)
    out += markdown_table(rows[0], rows[1:])
    if noisy := noise_warnings(summary):
        out += ["", "**Warning: noisy timings.**", "", *(f"- {line}" for line in noisy)]
    old = summary.get("rerendered")
    gc = "" if old else ", the Python garbage collector paused"
    causes = "" if old else " with their cause"
    first = "" if old else (" Time to first step: building the model and its state on the device, then the first "
                            "step (tracing, compilation, autotuning, first allocations).")
    out += ["", "Times are medians over measured steps after warm-up, each phase ended by a device "
            f"synchronization{gc}; in brackets the 10th-90th percentile "
            f"of the steps (outlier steps are listed below{causes}). `step` is forward + backward + "
            "optimizer inside one NVTX range. JAX's `fused_step` (value_and_grad and AdamW update in one "
            f"jit) is compared with the torch backends' `step`. Ratios are times over the first backend's.{first}",
            ""]
    if old:
        out += ["## Re-rendered from an older result document", "",
                f"- Figures recomputed with today's code from the recorded step times, FLOPs and peaks. The "
                f"document was {old['from_schema']} {old['from_format']}; the original is kept as "
                f"`{old['original']}`.",
                *(f"- {line[0].upper()}{line[1:]}." for line in [*old["dropped"].values(),
                                                                *([old["kernels"]] if old.get("kernels") else [])]),
                ""]
    if summary.get("per_device_upgrade"):
        out += [f"Re-rendered: {summary['per_device_upgrade']}; the original is kept as `summary-original.json`.",
                ""]
    notes = _notes(summary)
    if notes:
        out += ["## Overhead, outliers and warnings", ""] + [f"- {n}" for n in notes] + [""]
    out += data_parallel_lines(summary)
    out += ["## Parity", "", parity_verdict(summary["parity"]), ""]
    if summary["parity"] and summary["parity"].get("ok") is not None:
        out += [f"Tolerance table against eager torch ({o['dtype']}), {backend}: "
                + ", ".join(f"{k} {v:.0e}" for k, v in bounds.items())
                for backend, bounds in summary["parity"]["tolerances"].items()] + [""]
    out += ["## What each run computed", ""]
    for backend, r in runs.items():
        if not r.ok:
            continue
        ov = r.get("overhead")
        loss = r["loss"]
        steps = "first_after_steps" in loss
        after = f" (after {loss['first_after_steps']} and {loss['last_after_steps']} optimizer steps)" if steps else ""
        out += [f"- **{backend}** ({r.options['attention']} attention): {precision_text(r, _on_cpu(summary))}.",
                f"  Loss at the first/last measured {'split ' if steps else ''}step: {loss['first']:.4f} / "
                f"{loss['last']:.4f}{after}. {_memory_text(r)}"]
        if ov:
            out.append(f"  Instrumentation overhead: {ov['compared']}: {ov['instrumented_step_ms']:.3f} ms vs "
                       f"{ov['plain_step_ms']:.3f} ms, ratio {ov['ratio']:.3f}.")
        first = r.get("first_step")
        if first:
            out.append("  First steps: " + ", ".join(f"{k.removesuffix('_ms').replace('_', ' ')} {v / 1e3:.2f} s"
                                                      for k, v in first.items() if k.endswith("_ms")) + ".")
        opt = r.phases.get("optimizer")
        if opt and opt.get("gb_per_s"):
            out.append(f"  Optimizer: {opt['bytes'] / 1e9:.2f} GB of AdamW traffic at {opt['gb_per_s']:.0f} GB/s.")
    ok = [r for r in runs.values() if r.ok]
    if ok:
        r = ok[0]
        peak = (f"Peak used for MFU: {r['peak_tflops']} TFLOP/s per device ({o['dtype']})" if r["peak_tflops"] else
                "No MFU: this device is not in the peak table (`harness/common/hardware.py`)")
        out += ["", f"FLOPs: {r['flops_formula']}. {peak}. Parameters: {r['num_params']:,}.",
                *_figures_line(summary), "", "## Environment", ""]
        if command := (summary.get("env") or {}).get("command"):
            out.append(f"- command: `{command}` (each backend ran `harness.run` in a subprocess, with the "
                       "command listed beside it)")
        for backend, r in runs.items():
            if r.ok:
                out.append(f"- {backend}: " + ", ".join(f"{k} {v}" for k, v in r["env"].items()))
    if summary.get("plot"):
        out += ["", "Phase times per backend: bars are the medians, whiskers the 10th-90th percentile of the steps.",
                "", f"![phase times]({summary['plot']})"]
    if summary.get("kernel_breakdown_error"):
        out += ["", f"**Kernel breakdown failed**: {summary['kernel_breakdown_error']}"]
    if kernels:
        out += ["", *_nested(kernels)]
    return "\n".join(out) + "\n"


def _figures_line(summary: dict) -> list[str]:
    """What TFLOP/s, MFU and tokens/s cover, for a data-parallel comparison."""
    n = (summary.get("data_parallel") or {}).get("n", 1)
    if n <= 1:
        return []
    return ["", f"Each of the {n} devices runs --batch {summary['options']['batch']} rows: TFLOP/s and MFU are per "
            "device (a torch rank's own work and time; one of JAX's devices, whose one program steps them all "
            "together), tokens/s is for the whole job (N x --batch rows per step)."]


def _nested(document: str) -> list[str]:
    """A markdown document as a section of this report: every heading one level deeper."""
    return [f"#{line}" if line.startswith("#") else line for line in document.splitlines()]


def has_phases_plot(summary: dict) -> bool:
    """Whether `plot_phases` draws anything: a phase in the table and a backend that ran."""
    return bool(summary["table"]) and any(r.ok for r in runs_of(summary).values())


def plot_phases(summary: dict, path: str) -> bool:
    """Grouped bars of median phase time per backend, the 10th-90th percentile of the steps
    as whiskers; a backend without a phase (torch has no fused_step) gets no bar in that
    group, and each backend keeps its colour. False if nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not has_phases_plot(summary):
        return False
    phases = [r["phase"] for r in summary["table"]]
    runs = runs_of(summary)
    backends = [b for b, r in runs.items() if r.ok]
    fig, ax = plt.subplots(figsize=(1.6 * len(phases) + 2, 4))
    width = 0.8 / len(backends)
    for i, backend in enumerate(backends):
        ph = runs[backend].phases
        xs, med, lo, hi = [], [], [], []
        for k, p in enumerate(phases):
            if p not in ph:
                continue
            have = [b for b in backends if p in runs[b].phases]  # centred on the group's own bars
            xs.append(k + (have.index(backend) - (len(have) - 1) / 2) * width)
            med.append(ph[p]["median_ms"])
            lo.append(ph[p]["median_ms"] - ph[p].get("p10_ms", ph[p]["median_ms"]))
            hi.append(ph[p].get("p90_ms", ph[p]["median_ms"]) - ph[p]["median_ms"])
        ax.bar(xs, med, width, yerr=[lo, hi], capsize=3, label=backend, color=f"C{i}")
    ax.set_xticks(range(len(phases)), phases)
    ax.set_ylabel("time per step (ms)")
    o = summary["options"]
    device = summary.get("device") or o["device"]
    ax.set_title(f"{o['model']} ctx {o['ctx']} batch {o['batch']} {o['dtype']} on {device}\n"
                 "bars: median of the steps; whiskers: 10th-90th percentile", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
