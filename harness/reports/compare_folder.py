"""A comparison's result folder, written whole: its documents (summary.json, each backend's
document, kernels.json) and its reports (report.md, report.html, phases.png and the kernels.*
breakdown), or, when the reports cannot be written, the documents alone."""

from __future__ import annotations

import json
import os
import shutil
import sys

from harness.common.results import ensure_dir, make_dir_tmp, write_json
from harness.trace.analyses.ranks import KernelBreakdown


def _free_name(root: str, name: str) -> str:
    """`name`, or `name-2`, `name-3`, ... the first that does not exist under `root`."""
    candidates = (name if n == 1 else f"{name}-{n}" for n in range(1, 10_000))
    return next(c for c in candidates if not os.path.exists(os.path.join(root, c)))


def attach_mfu_points(summary: dict, entries: list[dict]) -> None:
    """Each profiled backend's step as points of MFU (`profiled_mfu_points`), into its run's
    record in `summary` ("mfu_points"), where its profile and document give them: the
    comparison's answer says them (`compare_findings`). One device's runs only: on several,
    the communication kernels run beside the compute, which these parts do not split."""
    from harness.diffs.throughput import profiled_mfu_points

    if (summary.get("data_parallel") or {}).get("n", 1) > 1:
        return
    runs = summary.get("runs") or {}
    for entry in entries:
        run = runs.get(entry.get("label"))
        if isinstance(run, dict) and run.get("status") == "ok" and (points := profiled_mfu_points(entry, run)):
            run["mfu_points"] = points


def write_results(summary: dict, results_root: str, name: str, kernels: KernelBreakdown | None = None,
                  overwrite: bool = False, runs: dict[str, dict] | None = None) -> str:
    """Write summary.json, report.md, report.html, phases.png (the kernels.* breakdown, and `runs` as
    <backend>.json) into a temp dir, then move it into place: an interrupted run leaves no
    half-written folder. An existing folder `name` is replaced with `overwrite`, else kept
    and the new one written beside it (`name-2`, ...)."""
    from harness.common.html import svg_of, write_html
    from harness.reports.compare import compare_markdown, plot_phases

    ensure_dir(results_root)
    if not overwrite and os.path.exists(os.path.join(results_root, name)):
        kept = _free_name(results_root, name)
        print(f"[compare] {os.path.join(results_root, name)} exists; writing {kept} beside it "
              "(--overwrite replaces it)", file=sys.stderr)
        name = kept
    final = os.path.join(results_root, name)
    print(f"[compare] writing {final}: report, plots{' and kernel breakdown' if kernels else ''}", file=sys.stderr)
    tmp = make_dir_tmp(f".{name}.", results_root)
    try:
        for backend, doc in (runs or {}).items():
            write_json(os.path.join(tmp, f"{backend}.json"), doc)
        kernels_md = None
        if kernels:
            from harness.common.answer import answer_markdown
            from harness.reports.breakdown import breakdown_document, breakdown_markdown, write_report
            from harness.trace.analyses.findings import report_findings

            write_report(tmp, kernels.breakdowns, kernels.answers, stem="kernels",
                         lead=answer_markdown(report_findings(kernels.breakdowns)))
            kernels_md = breakdown_markdown(kernels.breakdowns, kernels.answers)
            attach_mfu_points(summary, breakdown_document(kernels.breakdowns, kernels.answers))
        if plot_phases(summary, os.path.join(tmp, "phases.png")):
            summary["plot"] = "phases.png"
        with open(os.path.join(tmp, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        with open(os.path.join(tmp, "report.md"), "w") as f:
            f.write(compare_markdown(summary, kernels_md))
        svgs = {"phases.png": svg_of(lambda path: plot_phases(summary, path))}
        if kernels:
            from harness.reports.plot import plot as plot_kernels

            svgs["kernels.png"] = svg_of(lambda path: plot_kernels(path, kernels.breakdowns))
        write_html(tmp, "report.md", svgs)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def keep_documents(summary: dict, root: str, name: str, kernels: KernelBreakdown | None) -> str:
    """summary.json, each backend's document and kernels.json, without any report, in a new
    folder `name` under `root` (a number added where the name is taken); its path."""
    from harness.common.results import write_text
    from harness.reports.breakdown import breakdown_document

    path = os.path.join(root, _free_name(root, name))
    os.makedirs(path)
    for backend, doc in summary["runs"].items():
        write_json(os.path.join(path, f"{backend}.json"), doc)
    if kernels:
        document = breakdown_document(kernels.breakdowns, kernels.answers)
        write_text(os.path.join(path, "kernels.json"), json.dumps(document, indent=1, default=str))
    write_json(os.path.join(path, "summary.json"), summary)
    return path
