"""kernels.json reads back into the breakdown it was written from, and a compare folder's
kernels.md is rendered from it only where the document is today's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from harness.reports.breakdown import breakdown_document
from harness.runs.upgrade import rerender
from harness.trace.stats import Breakdown, PhaseStats, breakdowns_of

RESULTS = Path(__file__).parent.parent / "results"
MAIN = RESULTS / "main-job" / "large-ctx256-bf16-h100-80gb-hbm3-profiled"  # written by today's compare
OLD = RESULTS / "main-job" / "large-ctx256-bf16-h200-profiled"  # a kernels.json from before the busy and copy figures


def test_the_document_reads_back_into_the_breakdown() -> None:
    doc = json.loads((MAIN / "kernels.json").read_text())
    bds, answer_sets = breakdowns_of(doc)
    assert [type(bd) for bd in bds] == [Breakdown] * 3 and all(isinstance(p, PhaseStats) for p in bds[2].phases.values())
    step = bds[0].phases["step"]
    assert step.gpu_ns_per_step == doc[0]["phases"]["step"]["gpu_ns_per_step"]
    assert step.kernels[0].name == doc[0]["phases"]["step"]["kernels"][0]["name"]
    assert json.loads(json.dumps(breakdown_document(bds, answer_sets), default=str)) == doc


def test_a_current_document_renders_kernels_md_answer_first(tmp_path: Path) -> None:
    folder = tmp_path / MAIN.name
    shutil.copytree(MAIN, folder)
    committed = (folder / "kernels.md").read_text()
    (folder / "kernels.md").write_text("stale\n")
    rerender(str(folder), figures=False)
    md = (folder / "kernels.md").read_text()
    assert md == committed and md.splitlines()[2] == "## The answer"


def test_an_older_document_keeps_its_kernels_md(tmp_path: Path) -> None:
    folder = tmp_path / OLD.name
    shutil.copytree(OLD, folder)
    assert "busy_ns_per_step" not in json.loads((folder / "kernels.json").read_text())[0]["phases"]["step"]
    rerender(str(folder), figures=False)
    assert (folder / "kernels.md").read_bytes() == (OLD / "kernels.md").read_bytes()  # no figure from a default
    assert "GPU busy" not in (folder / "report.md").read_text()
