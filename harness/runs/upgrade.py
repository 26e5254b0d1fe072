"""Render an existing compare folder again from its summary.json with today's report code
(the library behind `python -m harness.compare --render FOLDER`).

Data-parallel runs written before the per-device figures are brought to today's units
(`harness.timing.legacy.per_device_run`). Documents written before the robust statistics (each
phase with mean, std, median, min, max and its step times only) are upgraded first, as far as
their data allows: each phase's figures are recomputed from its recorded step times
(`harness.common.stats`), and throughput, TFLOP/s, MFU and the phase table's ratios from the
recorded FLOPs and peaks, the way a run computes them today. What the old documents cannot give
is dropped and the report says so, one line each: their instrumentation-overhead ratio
(measured by a method that compared unlike statistics, so it is not carried over), the time to
first step, the causes of outlier steps (they need the run's event log) and the optimizer-step
counts of the logged losses. The original summary.json is kept byte for byte beside the
upgraded one.
"""

from __future__ import annotations

import copy
import json
import os
import shutil

from harness.common.documents import COMPARE_SCHEMA, DocumentError, RunDocument, is_document, runs_of
from harness.common.results import atomic_path, write_json, write_text
from harness.common.stats import summarize
from harness.runs.compare import phase_table
from harness.timing.legacy import PER_DEVICE, per_device_run

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


def _breakdowns(path: str) -> tuple[list, list[dict]] | None:
    """The breakdowns and answers of a compare folder's kernels.json, or None where the
    document is not today's: it must read back into the breakdown and write out again the
    same, so that no figure an older run did not record is rendered from a default."""
    from harness.reports.breakdown import breakdown_document
    from harness.trace.stats import breakdowns_of

    try:
        with open(path) as f:
            doc = json.load(f)
        bds, answer_sets = breakdowns_of(doc)
        same = json.loads(json.dumps(breakdown_document(bds, answer_sets), default=str)) == doc
    except (TypeError, KeyError, ValueError, AttributeError):
        return None
    return (bds, answer_sets) if same else None


def _kernels_markdown(breakdowns: tuple[list, list[dict]]) -> tuple[str | None, list[str]]:
    """(the kernel breakdown as compare's report embeds it, the answer kernels.md opens with);
    (None, []) where today's renderer cannot read the old document's figures."""
    from harness.common.answer import answer_markdown
    from harness.reports.breakdown import breakdown_markdown
    from harness.trace.analyses.findings import report_findings

    try:
        return breakdown_markdown(*breakdowns), answer_markdown(report_findings(breakdowns[0]))
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        return None, []


class RenderError(ValueError):
    """A folder that cannot be rendered; the message says why."""


def is_legacy(summary: dict) -> bool:
    """True for a compare document whose phase records predate the robust statistics."""
    return any("p10_ms" not in rec for r in runs_of(summary).values() if r.ok for rec in r.phases.values())


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
    finished = {b for b, r in runs_of(summary).items() if r.ok}
    for b, r in new["runs"].items():
        if b not in finished:
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
            if not (is_document(summary, COMPARE_SCHEMA)
                    and "runs" in summary):
                problem = "summary.json is not a harness.compare document"
    if problem:
        raise RenderError(f"--render {folder}: {problem}; pass a result folder that `python -m harness.compare` "
                          "wrote (results/<model>-ctx<N>-<dtype>-<gpu>[-profiled]/)")
    if problem := shape_problem(summary):
        raise RenderError(f"--render {folder}: {path}: {problem}; restore it (summary-original.json, or the "
                          "document as harness.compare wrote it) or run the comparison again; nothing was written")
    return summary


# What the report reads from a compare document: top-level keys and their types, the options its title names.
REQUIRED = {"runs": dict, "options": dict, "table": list, "parity": (dict, type(None))}
TITLE_OPTIONS = ("model", "ctx", "batch", "dtype", "attention", "mode", "device")


def _kind(value: object) -> str:
    names = {dict: "an object", list: "a list", str: "a string", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def shape_problem(summary: dict) -> str | None:
    """The first key of a compare document that the report needs and finds missing or of the
    wrong type (one phrase naming it), or None: checked before anything is written, so a
    hand-edited or cut-short summary.json is refused whole instead of failing half-way."""
    for key, kind in REQUIRED.items():
        if key not in summary:
            return f"no key {key!r}"
        if not isinstance(summary[key], kind):
            wanted = " or ".join(_kind(k()) for k in (kind if isinstance(kind, tuple) else (kind,)))
            return f"{key!r} is {_kind(summary[key])}, not {wanted}"
    if missing := [k for k in TITLE_OPTIONS if k not in summary["options"]]:
        return f"'options' has no {missing[0]!r}"
    for backend, run in summary["runs"].items():
        if not isinstance(run, dict):
            return f"runs[{backend!r}] is {_kind(run)}, not an object"
        try:
            ok = RunDocument.from_dict(run, f"runs[{backend!r}]", need_schema=False).ok
        except DocumentError as exc:
            return str(exc)
        if ok and not isinstance(run.get("phases"), dict):
            return f"runs[{backend!r}] is ok but has no 'phases' object"
        if not ok and not isinstance((run.get("error") or {}).get("message"), str):
            return f"runs[{backend!r}] failed but has no error message"
    for row in summary["table"]:
        if not isinstance(row, dict) or "phase" not in row:
            return "'table' holds a row without a 'phase'"
    parity = summary["parity"]
    if parity and parity.get("ok") is not None:
        for key in ("worst", "tolerances"):
            if not isinstance(parity.get(key), dict):
                return f"'parity' has a verdict but no {key!r} object"
    return None


def rerender(folder: str, figures: bool = True) -> list[str]:
    """Write report.md, report.html and phases.png of a compare folder from its summary.json (upgraded
    first when it is old, the original kept as `ORIGINAL`); the kernel breakdown is taken
    from the folder's kernels.json where it is today's (and its steps recorded in points of
    MFU, `attach_mfu_points`), else from its kernels.md. Without `figures`, the text alone (report.md, summary.json):
    no plot is drawn and no report.html written, the report naming phases.png as a render with
    figures would. Returns the paths written; bad folders raise RenderError."""
    from harness.common.html import svg_of, with_link, write_html
    from harness.reports.compare import compare_markdown, has_phases_plot, plot_phases

    summary = _load(folder)
    written = []
    try:  # every file drawn in full before any is replaced; a value shape_problem cannot see is caught
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
        kernels, kernels_md, breakdowns = os.path.join(folder, "kernels.md"), None, None
        if os.path.exists(os.path.join(folder, "kernels.json")):
            breakdowns = _breakdowns(os.path.join(folder, "kernels.json"))
        if breakdowns:
            kernels_md, lead = _kernels_markdown(breakdowns)
            breakdowns = breakdowns if kernels_md else None
        if breakdowns:  # the profiled steps in points of MFU, as compare records them
            from harness.reports.breakdown import breakdown_document
            from harness.reports.compare_folder import attach_mfu_points

            attach_mfu_points(summary, breakdown_document(*breakdowns))
        if not breakdowns and os.path.exists(kernels):
            with open(kernels) as f:
                kernels_md = f.read()
            if summary.get("rerendered"):
                summary["rerendered"]["kernels"] = KERNELS_KEPT
        summary.pop("plot", None)
        phases, report = os.path.join(folder, "phases.png"), os.path.join(folder, "report.md")
        with atomic_path(phases) as new_plot:
            if plot_phases(summary, new_plot) if figures else has_phases_plot(summary):
                summary["plot"] = "phases.png"
                written += [phases] if figures else []
            markdown = compare_markdown(summary, kernels_md)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        detail = f"no key {exc.args[0]!r}" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
        raise RenderError(f"--render {folder}: summary.json cannot be rendered ({detail} where the report reads it); "
                          "restore the document as harness.compare wrote it; nothing was replaced") from None
    if breakdowns:  # kernels.md/.csv/.json as compare writes them, the answer first
        from harness.reports.breakdown import write_report

        written += [str(p) for p in write_report(folder, *breakdowns, stem="kernels", png=False, lead=lead).values()]
    write_text(report, with_link(markdown))
    if figures:  # kernels.png cannot be drawn again from the folder's files: report.html embeds it as it is
        written.append(str(write_html(folder, "report.md", {"phases.png": svg_of(lambda p: plot_phases(summary, p))})))
    write_json(os.path.join(folder, "summary.json"), summary)
    return [*written, report, os.path.join(folder, "summary.json")]
