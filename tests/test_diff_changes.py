"""`harness.diff` names what the two sides were run with differently (`harness.diffs.changes`),
from real run documents (the small model on one H200) and copies of them with one field changed."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from harness.diffs.changes import changes_sentence, run_changes
from harness.diffs.inputs import Run

DATA = Path(__file__).parent / "data" / "gpu_clocks"


def _doc(n: int = 1) -> dict:
    return json.loads((DATA / f"torch-small-{n}.json").read_text())


def _run(doc: dict | None, label: str = "r") -> Run:
    return Run(label=label, source=label, doc=doc)


def test_runs_of_one_configuration_are_said_to_be_so() -> None:
    changes = run_changes([_run(_doc(1))], [_run(_doc(2))])
    assert changes == []
    assert "the gap is between runs of one configuration" in changes_sentence(changes)


def test_an_option_a_setting_and_the_tree_are_named_with_both_sides_values() -> None:
    b = _doc(1)
    b["options"]["attention"] = "pallas"
    b["env"]["settings"]["XLA_FLAGS"] = "--xla_gpu_enable_command_buffer="
    b["env"]["settings"]["TORCHINDUCTOR_CACHE_DIR"] = "/elsewhere"  # where code is cached: no change
    b["env"]["source_sha256"] = "f" * 64
    assert run_changes([_run(_doc(1))], [_run(b)]) == [
        {"what": "--attention", "a": "fused", "b": "pallas"},
        {"what": "XLA_FLAGS", "a": "unset", "b": "--xla_gpu_enable_command_buffer="},
        {"what": "source tree", "a": "bf82c26-dirty (source e813bfa)", "b": "bf82c26-dirty (source fffffff)"},
    ]


def test_the_tree_is_told_apart_by_what_ran_not_only_by_its_commit() -> None:
    a, b = _doc(1), _doc(1)
    for doc, commit in ((a, "509c2650" + "0" * 32), (b, "8cd22d10" + "0" * 32)):
        doc["env"]["git_commit"] = commit
    b["env"]["source_sha256"] = "f" * 64
    assert run_changes([_run(a)], [_run(b)]) == [{"what": "source tree", "a": "509c265", "b": "8cd22d1"}]
    # One commit for two trees (a copy whose git metadata lagged): the digests tell them apart.
    b["env"]["git_commit"] = a["env"]["git_commit"]
    assert run_changes([_run(a)], [_run(b)]) == [
        {"what": "source tree", "a": "509c265 (source e813bfa)", "b": "509c265 (source fffffff)"}]
    del b["env"]["git_commit"]
    assert run_changes([_run(a)], [_run(b)])[0]["b"] == "no commit (source fffffff)"
    del b["env"]["source_sha256"]  # an older document without a digest
    assert run_changes([_run(a)], [_run(b)]) == [
        {"what": "source tree", "a": "509c265", "b": "unset"}]


def test_a_version_counts_only_where_both_sides_record_it() -> None:
    b = _doc(1)
    b["env"]["torch"] = "2.12.0+cu130"
    b["env"]["gpu_power_limit"] = "500.00 W"
    b["env"]["jax"] = "0.11.2"  # a library only B records: another framework's, not a change
    changes = run_changes([_run(_doc(1))], [_run(b)])
    assert changes == [{"what": "gpu_power_limit", "a": "700.00 W", "b": "500.00 W"},
                       {"what": "torch", "a": "2.11.0+cu130", "b": "2.12.0+cu130"}]
    assert changes_sentence(changes) == ("A and B differ in gpu_power_limit 700.00 W -> 500.00 W; "
                                         "torch 2.11.0+cu130 -> 2.12.0+cu130.")


def test_a_side_whose_runs_disagree_lists_their_values() -> None:
    odd = _doc(2)
    odd["options"]["batch"] = 16
    changes = run_changes([_run(_doc(1)), _run(_doc(2))], [_run(_doc(1)), _run(odd)])
    assert changes == [{"what": "--batch", "a": "8", "b": "8 / 16"}]


def test_without_run_documents_nothing_is_said() -> None:
    assert run_changes([_run(_doc(1))], [_run(None)]) is None
    assert changes_sentence(None) is None


def test_the_diff_s_answer_names_the_change(tmp_path, capsys) -> None:
    from harness.diff import main

    b = copy.deepcopy(_doc(2))
    b["options"]["attention"] = "pallas"
    (tmp_path / "b.json").write_text(json.dumps(b))
    assert main([str(DATA / "torch-small-1.json"), str(tmp_path / "b.json"), "--out", str(tmp_path / "d")]) == 0
    answer = (tmp_path / "d" / "diff.md").read_text().split("## ")[1]
    assert "- A and B differ in --attention fused -> pallas." in answer
    saved = json.loads((tmp_path / "d" / "diff.json").read_text())
    assert saved["changes"] == [{"what": "--attention", "a": "fused", "b": "pallas"}]
