"""A run's tree: the source digest matches the digest of the commit it names, and a dirty
tree says which files changed and which diff it ran."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from harness.common import provenance


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.delenv("XFPROF_GIT_COMMIT", raising=False)
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "a.py").write_text("A = 1\n")
    (tmp_path / "harness" / "notes.md").write_text("not source\n")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "one")
    return tmp_path


def test_the_digest_is_the_source_and_the_commit_gives_it_back(repo: Path) -> None:
    expected = hashlib.sha256()  # by hand: path, NUL, size, NUL, bytes, in path order
    for path, data in (("harness/a.py", b"A = 1\n"), ("pyproject.toml", b"[project]\nname = 'x'\n")):
        expected.update(f"{path}\0{len(data)}\0".encode() + data)
    record = provenance.tree_record(repo)
    assert record == {"git_commit": _git(repo, "rev-parse", "HEAD"), "source_sha256": expected.hexdigest()}
    assert provenance.commit_digest("HEAD", repo) == expected.hexdigest()
    (repo / "harness" / "notes.md").write_text("edited, and not source\n")
    assert provenance.source_digest(repo) == expected.hexdigest()


def test_a_dirty_tree_names_its_changes(repo: Path) -> None:
    clean = provenance.tree_record(repo)
    (repo / "harness" / "a.py").write_text("A = 2\n")
    (repo / "harness" / "b.py").write_text("B = 1\n")  # new, not yet added
    record = provenance.tree_record(repo)
    assert record["git_commit"] == clean["git_commit"] + "-dirty"
    assert sorted(record["dirty_files"]) == ["harness/a.py", "harness/b.py"]
    assert record["source_sha256"] not in (clean["source_sha256"], provenance.commit_digest("HEAD", repo))
    (repo / "harness" / "b.py").write_text("B = 2\n")
    assert provenance.tree_record(repo)["diff_sha256"] != record["diff_sha256"]  # another change, another digest


def test_a_copy_names_its_commit_and_still_digests_what_ran(repo: Path, monkeypatch) -> None:
    monkeypatch.setenv("XFPROF_GIT_COMMIT", "0123abc")
    record = provenance.tree_record(repo)
    assert record == {"git_commit": "0123abc", "source_sha256": provenance.commit_digest("HEAD", repo)}
