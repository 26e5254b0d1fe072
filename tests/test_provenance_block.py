"""The provenance block of a results folder's README: what its documents record, and in words a
"-dirty" tree or a commit the README names that no document records."""

from __future__ import annotations

import json
from pathlib import Path

from harness import regenerate

COMMIT = "abcdef0123456789abcdef0123456789abcdef01"


def _folder(tmp_path: Path, readme_commit: str) -> Path:
    folder = tmp_path / "results" / "question"
    (folder / "runs").mkdir(parents=True)
    for i, (commit, device) in enumerate([(COMMIT, "NVIDIA H200"), (COMMIT + "-dirty", "NVIDIA H200")]):
        env = {"git_commit": commit, "gpu_name": device, "torch": "2.11.0", "driver": "580",
               "command": f"python -m harness.run --backend torch --out /tmp/x/run{i}.json"
                          + (" --keep-profiles /tmp/k" if i else "")}
        (folder / "runs" / f"run{i}.json").write_text(json.dumps({"status": "ok", "env": env}))
    (folder / "README.md").write_text(f"# Q\n\nRan at `{readme_commit}`.\n\n<!-- generated: provenance -->\n"
                                      "<!-- end generated -->\n")
    return folder


def test_the_block_says_what_the_documents_record(tmp_path, capsys) -> None:
    folder = _folder(tmp_path, "1234567")
    root = tmp_path / "results"
    assert regenerate.main(["--check", "--root", str(root)]) == 1  # the empty block is stale
    assert capsys.readouterr().out.startswith(str(folder / "README.md"))
    assert regenerate.main(["--root", str(root)]) == 0
    block = (folder / "README.md").read_text().split("<!-- generated: provenance -->\n")[1]
    lines = block.splitlines()
    assert lines[0] == ("From the 2 documents here (environment records, counted): device NVIDIA H200; "
                        "torch 2.11.0; tree abcdef0 (1), abcdef0-dirty (1).")
    # the machine's --out and --keep-profiles folders are no part of the command
    assert lines[1] == "Commands: `python -m harness.run --backend torch`."
    assert lines[2] == ("The runs record `abcdef0-dirty`: the tree had uncommitted changes, which the documents "
                        "do not name.")
    assert lines[3] == "The text above names `1234567`, which no document here records as its tree."
    assert regenerate.main(["--check", "--root", str(root)]) == 0


def test_a_readme_naming_the_recorded_tree_gets_no_remark(tmp_path, capsys) -> None:
    folder = _folder(tmp_path, "abcdef0")
    assert regenerate.main(["--root", str(tmp_path / "results")]) == 0
    assert "The text above names" not in (folder / "README.md").read_text()


def test_a_named_commit_whose_source_ran_dirty_is_matched_by_its_digest(tmp_path) -> None:
    """Runs from a copy whose git metadata lagged record an older commit "-dirty"; the commit the
    README names is matched to them by the source digest git gives for it (this repository's
    own `bc4e42f` and its parent), and the runs' dirty files are named where nothing matches."""
    from harness.common.provenance import commit_digest
    from harness.reports.provenance_block import provenance

    folder = tmp_path / "q"
    folder.mkdir()
    matched = {"git_commit": "02c0891-dirty", "source_sha256": commit_digest("bc4e42f"), "dirty_files": ["a.py"]}
    other = {"git_commit": "02c0891-dirty", "source_sha256": "0" * 64, "dirty_files": ["b.py", "a.py"]}
    (folder / "one.json").write_text(json.dumps({"status": "ok", "env": matched}))
    text = provenance(folder, "Ran at `bc4e42f`.")
    assert text.splitlines()[1:] == ["The text above names `bc4e42f`: the source of 1 environment record here, "
                                     "recorded as `02c0891-dirty`, is its tree's (their `source_sha256`)."]
    (folder / "two.json").write_text(json.dumps({"status": "ok", "env": other}))
    lines = provenance(folder, "Ran at `bc4e42f` and `02c0891`.").splitlines()
    assert lines[1] == "The runs record `02c0891-dirty`: uncommitted changes to `a.py`, `b.py`."
    assert len(lines) == 3 and "names `bc4e42f`" in lines[2]  # 02c0891 is a recorded tree: no remark
    # the parent of bc4e42f has another source: not matched
    assert "which no document here records" in provenance(folder, "Ran at `02c0891`'s child `9999999`.")
