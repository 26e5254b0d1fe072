"""The docs site builds in strict mode: every link between pages and every anchor resolves.

(a) `mkdocs build --strict` of the committed docs/ succeeds.
(b) A copy with one link to a page that does not exist, or to an anchor a page lacks, fails.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs", reason="mkdocs is not installed: pip install -e '.[test]' installs it")

ROOT = Path(__file__).resolve().parent.parent


def _build(repo: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=repo, capture_output=True, text=True, timeout=120)


def test_the_docs_build_in_strict_mode(tmp_path) -> None:
    done = _build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "site" / "main-job" / "index.html").read_text()
    assert "<table" in page and "jax, fused step" in page  # the generated block renders as a table


@pytest.mark.parametrize("link", ["[gone](no-such-page.md)", "[gone](main-job.md#no-such-section)"])
def test_a_broken_link_fails_the_build(link, tmp_path) -> None:
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    assert _build(tmp_path, tmp_path / "ok").returncode == 0  # the copy builds as committed
    page = tmp_path / "docs" / "parity.md"
    page.write_text(page.read_text() + f"\nSee {link}.\n")
    done = _build(tmp_path, tmp_path / "site")
    assert done.returncode != 0
    assert link.split("(")[1].rstrip(")") in done.stderr
