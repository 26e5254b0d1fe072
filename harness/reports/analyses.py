"""The registered analyses (`harness.trace.analyses.registry`) in a kernel report: per
analysis a table in kernels.md and its figures in ``<name>.json``, one entry per column.

An analysis the report shows with a table of its own says so in `OWN_RENDERING`; any other
gets the generic table: one row per column, one column per scalar field of its result
(fields holding lists or mappings go to the JSON only). So a new analysis appears in the
report without a line here.
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.common.results import write_text
from harness.common.tables import markdown_table
from harness.reports.ranks import render_gpu_time
from harness.trace.analyses.ranks import ReportInputs
from harness.trace.analyses.registry import discover, jsonable

# Analyses with a rendering (and JSON file) of their own: the section's lines (None: part of
# another table, the cross-rank one of `harness.reports.ranks.render_ranks`)
OWN_RENDERING: Mapping[str, Callable[[ReportInputs, str], list[str]] | None] = {
    "gpu_time": lambda inputs, detail: render_gpu_time(inputs.figures, detail),  # and gpu_time.json
    "communication": None,  # ranks.json
    "collectives": None,  # ranks.json
}


def _results(inputs: ReportInputs, name: str) -> list[Any]:
    return [column.get(name) for column in inputs.analyses]


def _cell(value: Any) -> str | None:
    """A scalar as a table cell; None for what a cell cannot hold."""
    if value is None:
        return "-"
    if isinstance(value, bool | str):
        return str(value)
    if isinstance(value, numbers.Integral):
        return f"{int(value):,}"
    if isinstance(value, numbers.Real):
        return f"{float(value):.4g}"
    return None


def generic_section(title: str, labels: Sequence[str], results: Sequence[Any]) -> list[str]:
    """Markdown lines: the heading and a table of the results' scalar fields, a row per column
    (a column the analysis did not apply to shows "-")."""
    fields: list[str] = []
    for r in results:
        if isinstance(d := jsonable(r), Mapping):
            fields += [k for k, v in d.items() if k not in fields and _cell(v) is not None]
    rows = []
    for label, r in zip(labels, results):
        d = jsonable(r) if r is not None else {}
        rows.append([label, *(_cell(d.get(k)) or "-" for k in fields)])
    return [f"## {title}", "", *markdown_table(["profile", *fields], rows), ""]


def analysis_sections(inputs: ReportInputs, detail: str) -> list[str]:
    """The report's lines for every registered analysis with results, in registration order."""
    labels = [bd.label for bd in inputs.breakdowns]
    out = []
    for name, a in discover().items():
        results = _results(inputs, name)
        if all(r is None for r in results):
            continue
        if name in OWN_RENDERING:
            render = OWN_RENDERING[name]
            out += render(inputs, detail) if render else []
            continue
        out += generic_section(a.title, labels, results)
    return out


def write_analyses(out: str | Path, inputs: ReportInputs) -> dict[str, Path]:
    """``<name>.json`` of every registered analysis without its own rendering, with results:
    one entry per column (its label and the result; None where it did not apply)."""
    labels = [bd.label for bd in inputs.breakdowns]
    paths = {}
    for name in discover():
        results = _results(inputs, name)
        if name in OWN_RENDERING or all(r is None for r in results):
            continue
        paths[name] = Path(out) / f"{name}.json"
        doc = [{"label": label, "result": jsonable(r)} for label, r in zip(labels, results)]
        write_text(paths[name], json.dumps(doc, indent=1, default=str))
    return paths
