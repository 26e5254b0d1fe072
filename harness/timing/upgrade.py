"""Render an existing compare folder again from its summary.json with today's report code
(the library behind `python -m harness.compare --render FOLDER`).

Data-parallel runs written before the per-device figures are brought to today's units
(`per_device_run`). Documents written before the robust statistics (each phase with mean, std, median, min,
max and its step times only) are upgraded first, as far as their data allows: each
phase's figures are recomputed from its recorded step times (`harness.common.stats`), and
throughput, TFLOP/s, MFU and the phase table's ratios from the recorded FLOPs and peaks,
the way a run computes them today. What the old documents cannot give is dropped and the
report says so, one line each: their instrumentation-overhead ratio (measured by a method
that compared unlike statistics, so it is not carried over), the time to first step, the
causes of outlier steps (they need the run's event log) and the optimizer-step counts of
the logged losses. The original summary.json is kept byte for byte beside the upgraded one.
"""

from __future__ import annotations

import copy
import json
import os
import shutil

from harness import backends
from harness.common.stats import summarize
from harness.timing.compare import phase_table

ORIGINAL = "summary-original.json"
LEGACY_FORMAT = "whose phases held mean, std, median, min, max and the step times only"
# What an upgraded document lacks, and why; the report prints one line each.
DROPPED = {
    "overhead": "the instrumentation-overhead ratio of these runs is not shown: they divided the median of the "
                "timed loop by the mean of a separately warmed plain loop, unlike statistics of unlike loops",
    "first_step": "time to first step was not recorded by these runs",
    "outlier_causes": "outlier steps are listed without a cause: these runs kept no event log (garbage "
                      "collections, compilations), and their steps were timed with the garbage collector running",
    "loss_steps": "the losses carry no optimizer-step counts; these runs logged the JAX run's last loss after its "
                  "fused-step loop as well, so the backends' last losses are not at equal step counts",
}
KERNELS_KEPT = ("the kernel breakdown below is kernels.md as the original run wrote it: the old kernels.json "
                "is not read back by today's breakdown code")


class RenderError(ValueError):
    """A folder that cannot be rendered; the message says why."""


def is_legacy(summary: dict) -> bool:
    """True for a compare document whose phase records predate the robust statistics."""
    return any("p10_ms" not in rec for r in summary.get("runs", {}).values() if r.get("status") == "ok"
               for rec in r.get("phases", {}).values())


PER_DEVICE = ("per-device figures recomputed: this run predates them (JAX's TFLOP/s and peak were summed over its "
              "devices, a torch rank's tokens/s counted its own rows only)")


def per_device_run(doc: dict) -> dict:
    """A run document in today's units (`harness.timing.runner.FIGURES`): a data-parallel
    run written before them gets JAX's FLOPs, TFLOP/s and peak divided by N (MFU, a
    ratio of the two, is unchanged) and a torch rank's tokens/s multiplied by N (the
    whole job's rows). Documents that carry `figures`, and one-device runs, come back as
    they are; nothing is changed in place."""
    from harness.timing.runner import FIGURES

    n = (doc.get("data_parallel") or {}).get("n") or (doc.get("options") or {}).get("data_parallel") or 1
    if doc.get("status") != "ok" or "figures" in doc or n == 1:
        return doc
    new = copy.deepcopy(doc)
    backend = new["options"]["backend"]
    # one process over every device summed its devices' work (JAX); a rank counted its own rows
    jax = backend in backends.names() and backends.get(backend).one_process
    records = [new["phases"], *(r["phases"] for r in new.get("ranks", []))]
    for rec in (p for phases in records for p in phases.values()):
        if jax:
            rec["flops"] = rec["flops"] // n if rec.get("flops") else rec.get("flops")
            rec["tflops"] = rec["tflops"] / n if rec.get("tflops") else rec.get("tflops")
        elif rec.get("tokens_per_s"):
            rec["tokens_per_s"] *= n
    if jax and new.get("peak_tflops"):
        new["peak_tflops"] /= n
    new["figures"] = FIGURES
    new["upgraded"] = PER_DEVICE
    return new


def _upgrade_phase(rec: dict, tokens: int, peak_tflops: float | None) -> dict:
    """The phase record a run writes today, from the old record's step times, FLOPs and peak."""
    new = summarize(rec["times_ms"])
    seconds = new["median_ms"] / 1e3
    new["times_ms"] = rec["times_ms"]
    new["tokens_per_s"] = tokens / seconds
    new["flops"] = rec.get("flops")
    new["tflops"] = new["flops"] / seconds / 1e12 if new["flops"] else None
    new["mfu"] = new["tflops"] / peak_tflops if new["tflops"] and peak_tflops else None
    new["peak_memory_bytes"] = rec.get("peak_memory_bytes")
    if rec.get("bytes"):
        new["bytes"] = rec["bytes"]
        new["gb_per_s"] = rec["bytes"] / seconds / 1e9
    return new


def upgrade(summary: dict, source_schema: str) -> dict:
    """A copy of an old compare document in today's format; `rerendered` says from what
    and which fields were dropped (`DROPPED`)."""
    new = copy.deepcopy(summary)
    for r in new["runs"].values():
        if r.get("status") != "ok":
            continue
        tokens = r["options"]["batch"] * r["options"]["ctx"]  # these runs had no data parallelism
        r["phases"] = {name: _upgrade_phase(rec, tokens, r.get("peak_tflops")) for name, rec in r["phases"].items()}
        r["overhead"] = None
        r.pop("first_step", None)
        r["loss"] = {"first": r["loss"]["first"], "last": r["loss"]["last"]}
    new["table"] = phase_table(new["runs"])
    new["reference"] = next(iter(new["runs"]), None)
    parity = new.get("parity") or {}
    if parity.get("tolerances") and not isinstance(next(iter(parity["tolerances"].values())), dict):
        # one table then, for the one backend compared with eager torch; today one per backend
        parity["tolerances"] = {b: parity["tolerances"] for b in new["runs"] if b != new["reference"]}
    new["rerendered"] = {"from_schema": source_schema, "from_format": LEGACY_FORMAT, "original": ORIGINAL,
                         "dropped": DROPPED}
    return new


def _load(folder: str) -> dict:
    problem = None
    path = os.path.join(folder, "summary.json")
    if not os.path.isdir(folder):
        problem = "not a folder"
    elif not os.path.isfile(path):
        problem = "no summary.json in it"
    else:
        try:
            with open(path) as f:
                summary = json.load(f)
        except (OSError, ValueError) as exc:
            problem = f"summary.json is not readable JSON ({exc.__class__.__name__})"
        else:
            if not (isinstance(summary, dict) and str(summary.get("schema", "")).startswith("harness.compare/")
                    and "runs" in summary):
                problem = "summary.json is not a harness.compare document"
    if problem:
        raise RenderError(f"--render {folder}: {problem}; pass a result folder that `python -m harness.compare` "
                          "wrote (results/<model>-ctx<N>-<dtype>-<gpu>[-profiled]/)")
    return summary


def rerender(folder: str) -> list[str]:
    """Write report.md, report.html and phases.png of a compare folder from its summary.json (upgraded
    first when it is old, the original kept as `ORIGINAL`); the kernel breakdown is taken
    from the folder's kernels.md. Returns the paths written; bad folders raise RenderError."""
    from harness.common.html import svg_of, write_html
    from harness.timing.compare_render import compare_markdown, plot_phases

    summary = _load(folder)
    written = []
    if is_legacy(summary):
        schemas = sorted({r.get("schema", "?") for r in summary["runs"].values()})
        summary = upgrade(summary, f"{summary['schema']} with {', '.join(schemas)} runs")
        original = os.path.join(folder, ORIGINAL)
        if not os.path.exists(original):
            shutil.copy2(os.path.join(folder, "summary.json"), original)
            written.append(original)
    runs = {b: per_device_run(r) for b, r in summary["runs"].items()}
    if any(runs[b] is not r for b, r in summary["runs"].items()):
        summary = {**summary, "runs": runs, "table": phase_table(runs), "per_device_upgrade": PER_DEVICE}
        original = os.path.join(folder, ORIGINAL)
        if not os.path.exists(original):
            shutil.copy2(os.path.join(folder, "summary.json"), original)
            written.append(original)
    kernels, kernels_md = os.path.join(folder, "kernels.md"), None
    if os.path.exists(kernels):
        with open(kernels) as f:
            kernels_md = f.read()
        if summary.get("rerendered"):
            summary["rerendered"]["kernels"] = KERNELS_KEPT
    summary.pop("plot", None)
    if plot_phases(summary, os.path.join(folder, "phases.png")):
        summary["plot"] = "phases.png"
        written.append(os.path.join(folder, "phases.png"))
    with open(os.path.join(folder, "report.md"), "w") as f:
        f.write(compare_markdown(summary, kernels_md))
    # kernels.png cannot be drawn again from the folder's files: report.html embeds it as it is
    written.append(str(write_html(folder, "report.md", {"phases.png": svg_of(lambda p: plot_phases(summary, p))})))
    with open(os.path.join(folder, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return [*written, os.path.join(folder, "report.md"), os.path.join(folder, "summary.json")]
