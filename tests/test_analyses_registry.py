"""Analyses as one shape (`harness.trace.analyses.registry`): a new analysis is one module of
the package, which the report (kernels.md and `<name>.json`), the comparison (summary's
`analyses`) and the diff (diff.json's `analyses`) all run without naming it; the real
analyses are registered. The toy's figures are checked against SQL on the export."""

from __future__ import annotations

import gzip
import json
import sqlite3
import sys
from pathlib import Path

import pytest

import harness.trace.analyses as analyses_package
from harness import report
from harness.trace.analyses import registry

DATA = Path(__file__).parent / "data"
PROFILE = DATA / "torch_tiny_attn" / "torch_tiny_attn.sqlite.gz"

# A whole analysis module, as someone adding one would write it.
TOY_ANALYSIS = '''
from dataclasses import dataclass

from harness.trace.analyses.registry import Context, analysis
from harness.trace.profile import KERNEL, Profile


@dataclass
class Longest:
    kernels: int  # GPU kernels (no memcpy or memset) of the whole profile
    longest_ns: int  # the longest one's duration
    phases: list  # not a table cell: JSON only


@analysis("toy_longest", "Longest kernel (toy)")
def longest(profile: Profile, context: Context) -> Longest:
    kt = profile.kernels
    mask = kt.kind == KERNEL
    return Longest(int(mask.sum()), int(kt.duration[mask].max()), sorted(context.breakdown.phases))
'''


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The toy module planted in a folder of the analyses package's path (a new file of it)."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "toy_longest.py").write_text(TOY_ANALYSIS)
    monkeypatch.setattr(analyses_package, "__path__", [*analyses_package.__path__, str(folder)])
    yield tmp_path
    registry.unregister("toy_longest")
    sys.modules.pop("harness.trace.analyses.toy_longest", None)


def _reference(tmp_path: Path) -> tuple[int, int]:
    """Kernel count and longest kernel (ns) of the export, counted with SQL."""
    plain = tmp_path / "ref.sqlite"
    plain.write_bytes(gzip.decompress(PROFILE.read_bytes()))
    db = sqlite3.connect(plain)
    count, longest = db.execute("SELECT COUNT(*), MAX(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    db.close()
    return count, longest


def test_the_real_analyses_are_registered() -> None:
    found = registry.discover()
    assert {"gpu_time", "communication", "collectives"} <= set(found)
    assert all(a.name == name and callable(a.run) for name, a in found.items())


def test_a_planted_analysis_module_shows_up_in_the_report(toy: Path) -> None:
    out = toy / "out"
    assert report.main([str(PROFILE), "--out", str(out), "--no-plot", "--label", "torch"]) == 0
    count, longest = _reference(toy)
    (doc,) = json.loads((out / "toy_longest.json").read_text())
    assert doc["label"] == "torch"
    assert (doc["result"]["kernels"], doc["result"]["longest_ns"]) == (count, longest)
    assert "forward" in doc["result"]["phases"]
    md = (out / "kernels.md").read_text()
    assert "## Longest kernel (toy)" in md
    assert f"| torch | {count:,} | {longest:,} |" in md
    assert "phases" not in md.split("## Longest kernel (toy)")[1].splitlines()[2]  # the header row


def test_a_planted_analysis_reaches_the_comparison_and_the_diff(toy: Path) -> None:
    from harness.diffs.decompose import diff_runs
    from harness.diffs.inputs import resolve_one
    from harness.runs.compare_profiles import kernel_breakdown

    count, longest = _reference(toy)
    (toy / "torch.json").write_text((PROFILE.parent / "torch_tiny_attn.harness.json").read_text())
    got = kernel_breakdown({"torch": str(PROFILE)}, str(toy), None)
    assert got.analyses["torch"]["toy_longest"].longest_ns == longest
    (bd,) = got.breakdowns
    run = resolve_one(PROFILE)
    assert run.analyses["toy_longest"].kernels == count
    d = diff_runs(run, run)
    assert d.analyses["a"]["toy_longest"] == {"kernels": count, "longest_ns": longest,
                                             "phases": run.analyses["toy_longest"].phases}


def test_without_the_toy_the_report_writes_no_file_of_it(tmp_path: Path) -> None:
    """The toy's file and section come from the registration alone."""
    out = tmp_path / "out"
    assert report.main([str(PROFILE), "--out", str(out), "--no-plot"]) == 0
    assert not (out / "toy_longest.json").exists()
    assert "Longest kernel" not in (out / "kernels.md").read_text()
