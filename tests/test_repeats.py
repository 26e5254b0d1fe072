"""The table over every start of a scaling folder: a cell that ran several times shows the median
with the range and the count, counted by hand, never the best start."""

from __future__ import annotations

import json
from pathlib import Path

from harness import regenerate
from harness.reports.repeats import figure
from tests.test_scaling import _doc


def _write(folder: Path, docs: dict[str, dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, doc in docs.items():
        (folder / f"{name}.json").write_text(json.dumps(doc))


def _scaling_folder(tmp_path: Path, repeat: bool = False) -> Path:
    """Three starts of torch at N = 1 and 2: efficiencies 100/125 = 80.0%, 100/110 = 90.9%,
    100/200 = 50.0%; with `repeat`, N = 2 again on the first start at 100 ms (100.0% against it)."""
    folder = tmp_path / "scaling"
    for start, n2 in (("runs", 125.0), ("runs/round2", 110.0), ("runs/round3", 200.0)):
        _write(folder / start, {"torch-n1": _doc("torch", 1, 100.0), "torch-n2": _doc("torch", 2, n2)})
    if repeat:
        _write(folder / "runs" / "repeat", {"torch-n2-again": _doc("torch", 2, 100.0)})
    (folder / "repeats.md").write_text("")
    return folder


def _row(text: str, n: int) -> list[str]:
    return next(line.strip("| ").split(" | ") for line in text.splitlines()
                if line.startswith("| torch |") and line.split(" | ")[3] == str(n))


def test_three_starts_show_the_median_and_the_range_not_the_best(tmp_path, capsys) -> None:
    folder = _scaling_folder(tmp_path)
    assert regenerate.main(["--root", str(tmp_path)]) == 0
    text = (folder / "repeats.md").read_text()
    row = _row(text, 2)
    assert row[2] == "DDP, 25 MB buckets" and row[4] == "runs, runs/round2, runs/round3"
    assert row[5] == "125.0 (110.0-200.0, n=3)"  # the step's median, not its fastest
    assert row[6] == "80.0% (50.0-90.9, n=3)"  # the median start, not the best (90.9%)
    assert text.splitlines()[:2] == ["At N = 2, each backend's highest median efficiency over the starts:",
                                     "- torch (DDP, 25 MB buckets): 80.0% (50.0-90.9, n=3) over 3 starts"]
    assert regenerate.main(["--check", "--root", str(tmp_path)]) == 0
    (folder / "repeats.md").write_text(text.replace("80.0% (50.0", "90.9% (50.0", 1))  # the best as headline
    capsys.readouterr()
    assert regenerate.main(["--check", "--root", str(tmp_path)]) == 1
    assert capsys.readouterr().out.startswith(str(folder / "repeats.md"))


def test_a_repeat_folder_is_against_its_start_s_one_device_run(tmp_path) -> None:
    folder = _scaling_folder(tmp_path, repeat=True)
    assert regenerate.main(["--root", str(tmp_path)]) == 0
    text = (folder / "repeats.md").read_text()
    row = _row(text, 2)
    assert row[4] == "runs, runs/repeat, runs/round2, runs/round3"
    assert row[6] == "85.5% (50.0-100.0, n=4)"  # median of 50.0, 80.0, 90.9, 100.0
    assert _row(text, 1)[4] == "runs, runs/round2, runs/round3"  # the lent run is not counted again


def test_one_value_is_shown_alone() -> None:
    assert figure([89.76], "{:.1f}%") == "89.8%"
    assert figure([], "{:.1f}%") == "-"
    assert figure([3.0, 1.0, 2.0, 10.0], "{:.1f}") == "2.5 (1.0-10.0, n=4)"


def test_the_answer_names_each_backend_s_best_median_cell_best_first(tmp_path) -> None:
    """Two backends over the same three starts: JAX at N = 2 in 105, 104 and 250 ms against 100 at
    N = 1 (95.2%, 96.2%, 40.0%: median 95.2%) above torch's 80.0%; JAX's one start at N = 2 that
    scaled best (96.2%) is not its headline."""
    folder = _scaling_folder(tmp_path)
    for start, n2 in (("runs", 105.0), ("runs/round2", 104.0), ("runs/round3", 250.0)):
        _write(folder / start, {"jax-n1": _doc("jax", 1, 100.0), "jax-n2": _doc("jax", 2, n2)})
    assert regenerate.main(["--root", str(tmp_path)]) == 0
    lines = (folder / "repeats.md").read_text().splitlines()
    assert lines[1:3] == ["- jax (replicated): 95.2% (40.0-96.2, n=3) over 3 starts",
                          "- torch (DDP, 25 MB buckets): 80.0% (50.0-90.9, n=3) over 3 starts"]
