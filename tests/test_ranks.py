"""Per-rank files read as one job's ranks: one column per rank, ranks from what the trace
recorded, per-rank figures against hand counts from each rank's JSON, and sets that mix
jobs or miss a rank refused in one line."""

from __future__ import annotations

import gzip
import json
import shutil
from decimal import Decimal
from pathlib import Path

import pytest

from harness import report
from harness.trace.analyses.ranks import load_inputs, report_inputs
from harness.trace.profile import ProfileError

HTA = Path(__file__).parent / "data" / "hta"
SAMPLED = ("sampled_rank-0.json.gz", "sampled_rank-1.json.gz")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ranks")
    for name in SAMPLED:
        shutil.copy(HTA / name, out / name)
    return out


def _ns(us) -> int:
    return int(Decimal(str(us)) * 1000)


def _hand(name: str) -> dict:
    """Per ProfilerStep of one rank's trace: kernels launched inside it, counted from the JSON."""
    events = json.loads(gzip.decompress((HTA / name).read_bytes()), parse_float=Decimal)["traceEvents"]
    steps = [(_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])) for e in events
             if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    launch = {e["args"]["correlation"]: _ns(e["ts"]) for e in events if e.get("cat") == "cuda_runtime"}
    per_step = [sum(1 for e in events if e.get("cat") == "kernel" and e["args"]["correlation"] in launch
                    and lo <= launch[e["args"]["correlation"]] <= hi) for lo, hi in steps]
    return {"steps": len(steps), "kernels": per_step}


def test_folder_is_one_column_per_rank_with_hand_counted_steps(folder: Path) -> None:
    inputs = report_inputs([folder])
    bds, (table,) = inputs.breakdowns, inputs.ranks
    assert [bd.label for bd in bds] == ["rank0", "rank1"]
    assert table["ranks"] == [0, 1] and "torch.distributed's rank" in table["rank_source"]
    assert "2 of the job's 128 ranks" in table["rank_source"]
    for bd, name in zip(bds, SAMPLED):
        hand = _hand(name)
        p = bd.phases["ProfilerStep"]
        assert p.steps == hand["steps"] == 2
        assert p.kernels_per_step == sum(hand["kernels"]) / 2
    assert set(table["communication"]) == {0, 1}
    assert table["straggler"]["ProfilerStep"]["rank"] in (0, 1)


def test_rank_files_given_together_get_distinct_labels(tmp_path: Path) -> None:
    for rank, name in enumerate(SAMPLED):
        shutil.copy(HTA / name, tmp_path / f"job.rank{rank}.json.gz")
    (item,) = load_inputs([tmp_path / "job.rank0.json.gz", tmp_path / "job.rank1.json.gz"])
    assert [p.label for p in item.profiles] == ["rank0", "rank1"]
    # one file alone keeps its name, rank and all
    (alone,) = load_inputs([tmp_path / "job.rank1.json.gz"])
    assert alone.rank_set is None and alone.profiles[0].label == "job.rank1"


@pytest.mark.parametrize("files,needle", [
    ({"a_rank0.json.gz": "sampled_rank-0.json.gz", "b_rank1.json.gz": "ns_resolution_rank0.json.gz"},
     "mix profiles of different jobs"),
    ({"x_rank0.json.gz": "mi250_rocm.json.gz", "x_rank2.json.gz": "mi250_rocm.json.gz"},
     "rank file missing from the set: rank 1 of ranks 0..2"),
    ({"x_rank0.json.gz": "sampled_rank-0.json.gz", "x_rank1.json.gz": "sampled_rank-0.json.gz"},
     "a second profile of rank 0"),
])
def test_bad_sets_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture, files: dict, needle: str) -> None:
    folder = tmp_path / "set"
    folder.mkdir()
    for mine, theirs in files.items():
        shutil.copy(HTA / theirs, folder / mine)
    with pytest.raises(ProfileError, match=needle):
        load_inputs([folder])
    assert report.main([str(folder), "--out", str(tmp_path / "out"), "--no-plot"]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_report_has_a_rank_section(folder: Path, tmp_path: Path) -> None:
    assert report.main([str(folder), "--out", str(tmp_path), "--no-plot"]) == 0
    md = (tmp_path / "kernels.md").read_text()
    assert "## Ranks of `sampled_rank`" in md and "| rank0 | rank1 |" in md
    ranks = json.loads((tmp_path / "ranks.json").read_text())
    assert ranks[0]["ranks"] == [0, 1]
