"""What a run records about where and from which code it ran."""

from __future__ import annotations

import re

from harness import hardware


def test_commit_comes_from_git_in_a_checkout(monkeypatch) -> None:
    monkeypatch.delenv("XFPROF_GIT_COMMIT", raising=False)
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", hardware.git_commit() or "")


def test_an_explicit_commit_wins_over_the_copy_s_git(monkeypatch) -> None:
    # A copied tree may carry a stale .git folder; the commit named by whoever copied it wins.
    monkeypatch.setenv("XFPROF_GIT_COMMIT", "0123abc")
    assert hardware.git_commit() == "0123abc"
