"""Rank sets beyond 8 ranks: copies of a user's DDP ranks (`harness.trace.rank_copies`), one rank
planted 50% slow; the report's tables turn into distributions that name it, ranks.csv
holds every rank, kernels.md stays short, report.html keeps every column; the process
pool gives the serial figures; up to 8 ranks the tables keep one column per rank."""

from __future__ import annotations

import csv
import gzip
import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from harness import report
from harness.common.spread import spread
from harness.reports.breakdown import breakdown_markdown
from harness.reports.ranks import render_ranks
from harness.trace.analyses.breakdown import breakdown
from harness.trace.analyses.collectives import profile_split
from harness.trace.analyses.ranks import load_inputs, report_inputs
from harness.trace.analyses.selection import select
from harness.trace.profile import Kernel, Profile, Range
from harness.trace.rank_copies import copy_ranks

DDP = Path(__file__).parent / "data" / "user_profiles" / "torch_profiler"
SOURCES = [DDP / "rank0.json.gz", DDP / "rank1.json.gz"]
SLOW, FACTOR = 5, 1.5  # the planted rank, 50% slower (the two sources' ranks differ by some 15%)


@pytest.fixture(scope="module")
def twelve(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report of 12 generated ranks (the default: summary, parsed in a process pool)."""
    root = tmp_path_factory.mktemp("twelve")
    copy_ranks(SOURCES, 12, root / "ranks", seed=0, stragglers=(SLOW,), straggler=FACTOR)
    assert report.main([str(root / "ranks"), "--out", str(root / "out"), "--no-plot"]) == 0
    return root


def _steps_us(path: Path) -> list[float]:
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return [e["dur"] for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]


def test_copies_are_renumbered_and_the_planted_rank_stretched(twelve: Path) -> None:
    folder = twelve / "ranks"
    info = json.loads(gzip.decompress((folder / "rank7.json.gz").read_bytes()))["distributedInfo"]
    assert (info["rank"], info["world_size"]) == (7, 12)
    source = _steps_us(SOURCES[SLOW % 2])
    assert _steps_us(folder / f"rank{SLOW}.json.gz") == pytest.approx([FACTOR * d for d in source], rel=1e-9)
    other = _steps_us(folder / "rank3.json.gz")  # a copy of the same source, within the ±2% jitter
    assert all(0.98 - 1e-9 <= o / s <= 1.02 + 1e-9 for o, s in zip(other, source))


def test_beyond_8_ranks_tables_are_distributions_naming_the_planted_rank(twelve: Path) -> None:
    md = (twelve / "out" / "kernels.md").read_text()
    assert md.count("\n") < 300
    assert "| phase | metric | profiles | min | median | p90 | max | outliers |" in md and "| rank10 | rank11 |" not in md
    assert "3 x the median absolute deviation" in md
    rows = list(csv.DictReader(open(twelve / "out" / "ranks.csv")))
    assert [int(r["rank"]) for r in rows] == list(range(12))
    walls = {int(r["rank"]): float(r["ProfilerStep range_ms"]) for r in rows}
    assert max(walls, key=walls.get) == SLOW
    ranks_section = md.split("## Ranks of")[1]
    (line,) = [x for x in ranks_section.splitlines() if x.startswith("| ProfilerStep | range ms/step")]
    cells = [c.strip() for c in line.strip("|").split("|")]
    values = sorted(walls.values())
    assert cells[2] == "12"
    assert float(cells[3]) == pytest.approx(values[0], abs=1e-3)
    assert float(cells[4]) == pytest.approx(statistics.median(values), abs=1e-3)
    assert float(cells[5]) == pytest.approx(np.percentile(values, 90), abs=1e-3)
    assert float(cells[6]) == pytest.approx(values[-1], abs=1e-3)
    assert cells[7].startswith(f"rank{SLOW} +")
    html = (twelve / "out" / "report.html").read_text()
    assert "<th>rank11</th>" in html  # the page keeps one column per rank


def test_spread_rule_by_hand() -> None:
    values = {0: 10.0, 1: 10.2, 2: 9.9, 3: 10.1, 4: 13.0, 5: 10.0, 6: 9.0}
    s = spread(values)
    # median 10.0; deviations 0, .2, .1, .1, 3, 0, 1 -> MAD 0.1; beyond 0.3 and 0.5 (5%): ranks 4 (+3) and 6 (-1)
    assert s["median"] == 10.0 and s["min"] == 9.0 and s["max"] == 13.0
    assert s["p90"] == pytest.approx(np.percentile(list(values.values()), 90))
    assert list(s["outliers"]) == [4, 6] and s["outliers"][4] == pytest.approx(3.0)


def test_detail_full_restores_one_column_per_rank(twelve: Path, tmp_path: Path) -> None:
    assert report.main([str(twelve / "ranks"), "--out", str(tmp_path), "--no-plot", "--detail", "full"]) == 0
    md = (tmp_path / "kernels.md").read_text()
    assert "| phase | metric | rank0 | rank1 |" in md and "| rank11 |" in md
    assert md.count("\n") > (twelve / "out" / "kernels.md").read_text().count("\n")


def test_pool_gives_the_serial_figures_and_the_split_of_whole_profiles(tmp_path: Path) -> None:
    copy_ranks(SOURCES, 3, tmp_path, seed=1, stragglers=(1,))
    pool = report_inputs([tmp_path], jobs=2)
    serial = report_inputs([tmp_path], jobs=1)
    assert [bd.phases for bd in pool.breakdowns] == [bd.phases for bd in serial.breakdowns]
    assert (pool.answers, pool.ranks, pool.figures) == (serial.answers, serial.ranks, serial.figures)
    (item,) = load_inputs([tmp_path])  # every profile held at once, as before the pool
    sels = {r: select(p) for r, p in item.rank_set.profiles.items()}
    if any(s.mode == "launch" for s in sels.values()):  # one rule for every rank
        sels = {r: select(item.rank_set.profiles[r], "launch") for r in sels}
    assert pool.ranks[0]["split"] == profile_split(item.rank_set.profiles, selections=sels)
    assert pool.ranks[0]["split"]["last_rank"] == 1


def test_up_to_8_ranks_the_tables_keep_one_column_per_rank(twelve: Path) -> None:
    doc = json.loads((twelve / "out" / "ranks.json").read_text())[0]
    keep = lambda d: {int(r): v for r, v in d.items() if int(r) < 8}  # noqa: E731
    t = {**doc, "ranks": list(range(8)), "phases": {p: keep(v) for p, v in doc["phases"].items()},
         "communication": keep(doc["communication"]), "split": None}
    summary, full = render_ranks([t], "summary"), render_ranks([t], "full")
    assert summary == full  # these traces have few phases: nothing left out
    assert "| phase | metric | rank0 | rank1 | rank2 | rank3 | rank4 | rank5 | rank6 | rank7 |" in summary


def test_summary_lists_top_kernels_of_the_first_phases_beside_range_inferred_categories() -> None:
    """The summary's top-kernel sections follow its phases even where the report also lists
    categories inferred from ranges (whose lines once reused the phases' variable)."""
    ranges = [Range("step", 0, 100), Range("forward", 0, 100), Range("attn_softmax", 10, 50)]
    kernels = [Kernel("input_reduce_fusion_3", 20, 40), Kernel("input_reduce_fusion_3", 60, 70)]
    bd = breakdown(Profile("planted.sqlite", "planted", "nsys", kernels, ranges))
    md = breakdown_markdown([bd], detail="summary")
    assert "inside `attn_softmax` are softmax" in md
    assert [line for line in md.splitlines() if line.startswith("### ")][1:] == ["### step", "### forward"]
