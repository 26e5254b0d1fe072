"""Rendering of a sweep's analysis (`harness.sweeps.analysis.analyze`): report.md, cells.csv,
and the plots of `harness.reports.sweep_plots`.

A cell without a number is never shown as one: "OOM" (the run recorded an out-of-memory),
"failed" (an error, crash, signal or timeout; the reasons are listed at the end), "not run"
(not yet recorded), "-" (the phase does not exist for that cell, e.g. fused_step in torch).
A ratio of two cells names the side without a number ("OOM (jax)", "not run (bf16)").
Tables get a batch column when the sweep has more than one batch, and a devices column
(N, `--data-parallel`; the batch is per device) when it has more than one device count.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable

from harness import backends
from harness.common.answer import answer_markdown
from harness.common.documents import Status
from harness.common.html import svg_of, with_link, write_html
from harness.common.results import atomic_path, write_text
from harness.common.stats import figure
from harness.common.tables import markdown_table
from harness.reports.scaling import format_scaling
from harness.reports.sweep_answer import RULES, sweep_findings
from harness.reports.sweep_plots import (
    GIB,
    groups,
    has_memory,
    has_phases,
    has_time,
    plot_memory,
    plot_phase_bars,
    plot_time_vs_ctx,
)
from harness.sweeps.analysis import STATUS_TEXT, regime
from harness.timing.spec import PHASE_ORDER


def status_text(status: str) -> str:
    return STATUS_TEXT.get(status, status)


def _value(row: dict, value: object, fmt: Callable[[object], str]) -> str:
    """`value` formatted, or the cell's status where the cell has no numbers."""
    if row["status"] != Status.OK:
        return status_text(row["status"])
    return fmt(value) if value is not None else "-"


def _ms(p: dict) -> str:
    """Median and, as compare prints it, the 10th-90th percentile of the measured steps."""
    if "p10_ms" not in p:  # a record from before the robust statistics
        return f"{p['median_ms']:.2f}"
    return f"{p['median_ms']:.2f} ({p['p10_ms']:.2f}-{p['p90_ms']:.2f})"


def _x(v: float) -> str:
    return f"{v:.2f}x"


def _pct(v: float) -> str:
    return f"{100 * v:.1f}%"


def _gib(v: float) -> str:
    return f"{v / GIB:.3g}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [*markdown_table(header, rows), ""]


def _size_header(data: dict) -> list[str]:
    return ["model", "ctx", *(["batch"] if len(data["batches"]) > 1 else []),
            *(["N"] if len(data["data_parallel"]) > 1 else [])]


def _size(r: dict, data: dict) -> list[str]:
    return [r["model"], str(r["ctx"]), *([str(r["batch"])] if len(data["batches"]) > 1 else []),
            *([str(r["data_parallel"])] if len(data["data_parallel"]) > 1 else [])]


def _phases_present(rows: list[dict], candidates: tuple[str, ...] = PHASE_ORDER) -> list[str]:
    return [p for p in candidates if any(r.get(p) for r in rows)] or [p for p in candidates if p != "fused_step"]


# -- markdown sections -------------------------------------------------------------------
def section_times(data: dict) -> list[str]:
    out = ["## Phase times (ms, median and p10-p90 of the measured steps)", ""]
    for (backend, dtype), rows in groups(data["phases"], "backend", "dtype").items():
        phases = _phases_present(rows)
        out += [f"### {backend} {dtype}", ""]
        out += _table([*_size_header(data), *phases], [[*_size(r, data), *(_value(r, r[p], _ms) for p in phases)]
                                                       for r in rows])
    for (over, under), rows in groups(data["ratios"], "backend", "reference").items():
        a, b = backends.get(over), backends.get(under).framework_name
        fused = f"fused_step: {a.framework_name} fused step over {b} step; " if a.fused_step else ""
        out += [f"### {a.framework_name} / {b} (median ratio; {fused}< 1: {a.framework_name} faster)", ""]
        phases = _phases_present(rows)
        out += _table([*_size_header(data), "dtype", *phases],
                      [[*_size(r, data), r["dtype"], *(_value(r, r[p], _x) for p in phases)] for r in rows])
    return out


def section_bound(data: dict) -> list[str]:
    out = ["## Backward / forward", "",
           "Backward does twice the forward's matmul FLOPs, so a compute-bound step approaches 2x; a step "
           "dominated by memory traffic, launches or fixed overheads stays near 1x. Judged on one device only: "
           "on several, the backward also waits for the gradients' communication.", ""]
    out += _table([*_size_header(data), "backend", "dtype", "backward/forward", "regime"],
                  [[*_size(r, data), r["backend"], r["dtype"], _value(r, r["bwd_over_fwd"], _x),
                    regime(r)] for r in data["phases"]])
    for n in data["bound_notes"]:
        noisy = n.get("noisy", [])
        trend = ", ".join(f"{ctx}: {v:.2f}x" + (" (noisy)" if ctx in noisy else "") for ctx, v in n["ratios"])
        batch = f" batch {n['batch']}" if len(data["batches"]) > 1 else ""
        batch += f" N {n['data_parallel']}" if len(data["data_parallel"]) > 1 else ""
        if n["first"] is None:  # every context noisy: nothing to conclude
            out.append(f"- {n['backend']} {n['dtype']} {n['model']}{batch}: {trend}; not judged (every context's "
                       "steps noisy)")
            continue
        steady = " steady" if noisy else ""
        where = (f"reaches 1.5x at{steady} ctx {n['reaches_1_5x_at']}" if n["reaches_1_5x_at"] is not None
                 else f"stays below 1.5x over the{steady} contexts measured")
        first, last = n.get("first_ctx", n["ratios"][0][0]), n.get("last_ctx", n["ratios"][-1][0])
        span = (f"{n['first']} throughout" if n["first"] == n["last"] and not noisy
                else f"{n['first']} at every steady context" if n["first"] == n["last"]
                else f"{n['first']} at ctx {first} -> {n['last']} at ctx {last}")
        skipped = f"; ctx {', '.join(map(str, noisy))} noisy, not judged" if noisy else ""
        out.append(f"- {n['backend']} {n['dtype']} {n['model']}{batch}: {trend}; {where} ({span}{skipped})")
    return out + [""]


def section_throughput(data: dict) -> list[str]:
    phases = _phases_present(data["phases"], ("forward", "backward", "step", "fused_step"))
    out = ["## Achieved TFLOP/s and MFU (per device)", "",
           "TFLOP/s and MFU are per device: one device's FLOPs (its --batch rows) over the phase's time, against "
           "the datasheet peak of one device for the dtype; '-' where the device is not in the peak table (e.g. "
           "CPU).", ""]
    rows = [[*_size(r, data), r["backend"], r["dtype"],
             *(_value(r, (r[p] or {}).get("tflops"), figure) for p in phases),
             *(_value(r, (r[p] or {}).get("mfu"), _pct) for p in phases)] for r in data["phases"]]
    return out + _table([*_size_header(data), "backend", "dtype", *(f"{p} TFLOP/s" for p in phases),
                         *(f"{p} MFU" for p in phases)], rows)


def section_best(data: dict) -> list[str]:
    if not data["best"]:
        return []
    out = ["## Best MFU per backend", "",
           "Per backend and dtype, the cell whose whole training step (AdamW included; JAX: its fused step where "
           "that is faster) reaches the highest MFU per device (TFLOP/s per device where no peak is known), over "
           "every model, context, batch and device count N of the sweep; tokens/s is the whole job's.", ""]
    clocked = any(b.get("sm_mhz") for b in data["best"])  # runs that sampled the GPU's clock
    rows = [[b["backend"], b["dtype"], b["model"], str(b["ctx"]), str(b["batch"]), str(b["data_parallel"]),
             b["phase"], _pct(b["mfu"]) if b["mfu"] is not None else "-", figure(b["tflops"]),
             f"{b['tokens_per_s']:,.0f}" if b["tokens_per_s"] else "-",
             *([f"{b['sm_mhz']:.0f}" if b.get("sm_mhz") else "-",
                _pct(b["mfu_at_clock"]) if b.get("mfu_at_clock") else "-"] if clocked else [])]
            for b in data["best"]]
    if clocked:
        out += ["SM clock: the median over the step's measured calls; MFU at that clock: against the dense peak scaled "
                "to it from the datasheet's clock (`docs/results.md`).", ""]
    return out + _table(["backend", "dtype", "model", "ctx", "batch/device", "N", "step range", "MFU per device",
                         "TFLOP/s per device", "tokens/s (job)",
                         *(["SM clock MHz", "MFU at that clock"] if clocked else [])], rows)


def section_scaling(data: dict) -> list[str]:
    if not data["scaling"]:
        return []
    return ["## Scaling over devices", "", format_scaling(data["scaling"])]


def modelled(backend: str) -> bool:
    """Whether `harness.memory_model` predicts this backend's memory: it models what eager
    torch's autograd saves, so JAX (XLA's buffer assignment) has no prediction."""
    return backends.get(backend).memory_model


def fit_column(data: dict) -> bool:
    """A fit column only against a real device's memory: not on a CPU, unless
    --device-memory-gb names a size."""
    return data["sweep"]["options"].get("device") != "cpu" or "--device-memory-gb" in data["device_memory"]["source"]


def section_memory(data: dict) -> list[str]:
    dev = data["device_memory"]
    fits = fit_column(data)
    out = ["## Peak memory (GiB): measured / predicted", "",
           "Each cell is the measured peak / the predicted one. Predicted by `harness.memory_model` for the torch "
           "backends (parameters, gradients, AdamW m and v in fp32; activations eager torch saves for backward "
           "per layer; logits); it does not model JAX, whose rows show no prediction. Measured: the run's "
           "per-phase peak (torch: max_memory_allocated; JAX: the process-wide high-water mark; none on CPU). "
           + (f"Device memory for the fit column: {dev['source']}." if fits else
              "No fit column: a CPU has no device memory to fit in (--device-memory-gb sets one)."), ""]
    phases = ("forward", "backward", "optimizer", "step")

    def pair(r: dict, p: str) -> str:
        m = r[p]
        failed = r["status"] != Status.OK
        measured = _gib(m["measured"]) if m["measured"] else status_text(r["status"]) if failed else "-"
        return f"{measured} / {_gib(m['predicted']) if modelled(r['backend']) else '-'}"

    def ratio(r: dict) -> str:
        over = r["step"]["predicted_over_measured"]
        return _x(1 / over) if over and modelled(r["backend"]) else "-"

    def fit(r: dict) -> list[str]:
        return [("yes" if r["predicted_fits"] else "**no**") if modelled(r["backend"]) else "-"] if fits else []

    rows = [[*_size(r, data), r["backend"], r["dtype"], *(pair(r, p) for p in phases), ratio(r), *fit(r)]
            for r in data["memory"]]
    out += _table([*_size_header(data), "backend", "dtype", *phases, "step measured/predicted",
                   *(["fits (predicted)"] if fits else [])], rows)
    misses = [r for r in data["memory"] if fits and modelled(r["backend"]) and r["status"] in (Status.OK, Status.OOM)
              and (r["status"] == Status.OOM) == r["predicted_fits"]]
    if misses:
        out += ["Fit predictions contradicted by the run: " +
                ", ".join(f"{r['key']} ({'OOM' if r['status'] == Status.OOM else 'ran'})" for r in misses), ""]
    return out


def section_speedups(data: dict) -> list[str]:
    if not data["speedups"]:
        return []
    phases = _phases_present(data["speedups"])
    out = ["## Mixed vs full precision (fp32 median / other dtype's; > 1: faster)", ""]
    return out + _table([*_size_header(data), "backend", "dtype", *phases],
                        [[*_size(r, data), r["backend"], r["dtype"], *(_value(r, r[p], _x) for p in phases)]
                         for r in data["speedups"]])


def section_warmup(data: dict) -> list[str]:
    if not data["warmup"]:
        return []
    out = ["## Warm-up study", "",
           "The same cell with 0, 1, 2 and 5 warm-up steps. With none, the first measured step pays for what "
           "warm-up removes (JAX: tracing and compilation; torch: allocator growth, cuBLAS handle and "
           "workspace set-up), which inflates the mean and the std.", ""]

    def stat(r: dict, name: str) -> str:
        p = r[name]
        return _value(r, p, lambda v: f"{v['mean_ms']:.2f} ± {v['std_ms']:.2f} (first {v['first_ms']:.2f})")

    rows = [[r["model"], str(r["ctx"]), r["backend"], r["dtype"], str(r["warmup"]), stat(r, "step"),
             stat(r, "fused_step") if backends.get(r["backend"]).fused_step else "-"] for r in data["warmup"]]
    return out + _table(["model", "ctx", "backend", "dtype", "warm-up steps", "step mean ± std ms",
                         "fused_step mean ± std ms"], rows)


def section_kernels(data: dict) -> list[str]:
    if not data["kernels"]:
        return []
    out = ["## Kernels (nsys)", "", "Top forward kernel and category shares of GPU time (harness.breakdown).", ""]
    rows = []
    for r in data["kernels"]:
        if r["error"]:
            rows.append([r["key"], f"unreadable: {r['error']}", "", "", ""])
            continue
        f, s = r.get("forward"), r.get("step")
        cats = lambda p: ", ".join(f"{c} {_pct(v)}" for c, v in p["categories"].items()) if p else "-"  # noqa: E731
        top = f"{f['top_kernel'][:60]} ({_pct(f['top_share'])})" if f and f["top_kernel"] else "-"
        rows.append([r["key"], top, cats(f), s["phase"] if s else "-", cats(s)])
    return out + _table(["cell", "top forward kernel (share)", "forward categories", "step range", "step categories"],
                        rows)


def section_failed(data: dict) -> list[str]:
    if not data["failed"]:
        return []
    return ["## Failed cells", "", *(f"- {r['key']}: {status_text(r['status'])} ({r['status']}): {r['reason']}"
                                     for r in data["failed"]), ""]


def section_environment(data: dict) -> list[str]:
    """Where the cells ran: devices, framework versions, commits, and GPU sharing."""
    envs = [(c.get("result") or {}).get("env") or {} for c in data["cells"]]
    lines = []
    for label, key in (("device", "device"), ("driver", "driver"), *((lib, lib) for lib in backends.libraries()),
                       ("commit", "git_commit")):
        values = sorted({str(e[key]) for e in envs if e.get(key)})
        if values:
            lines.append(f"- {label}: {', '.join(values)}")
    gpus = sorted({c["gpu"] for c in data["cells"] if c.get("gpu") is not None}, key=int)
    if gpus:
        lines.append(f"- cells ran side by side, one per GPU (CUDA_VISIBLE_DEVICES {', '.join(gpus)} of one host), "
                     "each pinned to its own equal share of the CPUs; every cell measured one GPU")
    return ["## Environment", "", *lines, ""] if lines else []


def sweep_markdown(data: dict, plots: list[str]) -> str:
    o = data["sweep"]["options"]
    counts: dict[str, int] = {}
    for c in data["cells"]:
        counts[c["status"]] = counts.get(c["status"], 0) + 1
    batches = ", ".join(map(str, data["batches"]))
    lines = [f"# Sweep: batch {batches}, {o['attention']} attention, {o['mode']} on {o['device']}", "",
             f"warm-up {o['warmup']}, measured steps {o['steps']}; cells: "
             + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())), ""]
    lines += answer_markdown(sweep_findings(data), RULES)
    lines += section_environment(data)
    for section in (section_times, section_bound, section_throughput, section_best, section_scaling, section_memory,
                    section_speedups, section_warmup, section_kernels, section_failed):
        lines += section(data)
    counts = ", ".join(map(str, data["data_parallel"]))
    one = (f"The plots draw the cells on {data['data_parallel'][0]} device(s) only; the tables above hold every "
           f"device count (N = {counts})." if len(data["data_parallel"]) > 1 else "")
    lines += ["## Plots", "", *([one, ""] if one else []), *(f"![{p}]({p})" for p in plots), ""]
    return "\n".join(lines)


# -- CSV -------------------------------------------------------------------------------
def csv_rows(data: dict) -> list[dict]:
    """One row per main cell; numeric fields are empty where the cell has no number."""
    memory = {r["key"]: r for r in data["memory"]}
    out = []
    for r in data["phases"]:
        row = {k: r[k] for k in ("key", "model", "ctx", "batch", "data_parallel", "backend", "dtype", "status")}
        row["reason"] = r["reason"] or ""
        for p in PHASE_ORDER:
            ph = r[p] or {}
            for field in ("median_ms", "std_ms", "tflops", "mfu", "peak_memory_bytes", "sm_mhz", "mfu_at_clock"):
                row[f"{p}_{field}"] = "" if ph.get(field) is None else ph[field]
        row["bwd_over_fwd"] = r["bwd_over_fwd"] if r["bwd_over_fwd"] is not None else ""
        m = memory[r["key"]]
        for p in ("forward", "backward", "optimizer", "step"):
            row[f"{p}_predicted_bytes"] = m[p]["predicted"]
        row["predicted_fits"] = m["predicted_fits"]
        out.append(row)
    return out


def write_report(data: dict, out_dir: str, figures: bool = True) -> list[str]:
    """Write report.md, report.html, cells.csv and the plots into `out_dir`, each whole or not at
    all; returns the file names. Without `figures`, report.md and cells.csv alone, the report
    naming the plots a render with figures would draw."""
    # The plots draw one device count, the smallest; the tables and the scaling table hold all.
    n = data["data_parallel"][0] if data["data_parallel"] else 1
    one = {**data, **{k: [r for r in data[k] if r["data_parallel"] == n] for k in ("phases", "memory")}}
    drawn = (("time_vs_ctx.png", plot_time_vs_ctx, has_time), ("phases.png", plot_phase_bars, has_phases),
             ("memory.png", plot_memory, has_memory))
    plots = []
    for name, plot, has in drawn:
        with atomic_path(os.path.join(out_dir, name)) as path:
            if plot(one, path) if figures else has(one):
                plots.append(name)
    rows = csv_rows(data)
    with atomic_path(os.path.join(out_dir, "cells.csv")) as path, open(path, "w", newline="") as f:
        if rows:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    write_text(os.path.join(out_dir, "report.md"), with_link(sweep_markdown(data, plots)))
    if not figures:
        return ["report.md", "cells.csv"]
    write_html(out_dir, "report.md", {name: svg_of(lambda path, plot=plot: plot(one, path))
                                      for name, plot, _ in drawn if name in plots})
    return ["report.md", "report.html", "cells.csv", *plots]
