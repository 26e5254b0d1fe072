"""A real browser opens a committed report.html: headless Chromium (Debian's `chromium`)
reports no console message, and the page it built holds every table and plot; a click on a
header sorts its table. Skipped, with the reason, where Chromium is not installed."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from test_report_html import Page, check_page

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FOLDER = Path(__file__).parent.parent / "results" / "main-job" / "large-ctx256-bf16-h100-80gb-hbm3-profiled"
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (apt-get install chromium)")
# Sorts the first table by its first column, as a user's click would, and leaves the column's order in the DOM.
CLICK = ('<script>document.querySelector("th").click();document.body.setAttribute("data-sorted",'
         'Array.from(document.querySelector("table").tBodies[0].rows).map(function(r){'
         'return r.cells[0].textContent}).join("|"))</script>')


def _open(page: Path) -> tuple[str, list[str]]:
    """The DOM after the page's scripts ran, and the console messages Chromium logged."""
    run = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                          "--v=0", "--dump-dom", page.resolve().as_uri()], capture_output=True, text=True, timeout=120)
    return run.stdout, [line for line in run.stderr.splitlines() if ":CONSOLE" in line]


def test_console_errors_are_caught(tmp_path: Path) -> None:
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><script>undefined_function()</script></body></html>")
    _, console = _open(bad)
    assert len(console) == 1 and "undefined_function is not defined" in console[0]


def test_committed_report_in_chromium(tmp_path: Path) -> None:
    source = check_page(FOLDER, "report.md")  # what the file holds, parsed by Python
    page = tmp_path / "report.html"
    page.write_text((FOLDER / "report.html").read_text().replace("</body>", CLICK + "</body>"))
    dom, console = _open(page)
    assert console == []
    built = Page()
    built.feed(dom)
    assert len(built.tables) == len(source.tables) and built.svgs == source.svgs == 2
    assert [len(t) for t in built.tables] == [len(t) for t in source.tables]
    first = [row[0] for row in source.tables[0][1:]]
    sorted_ = re.search(r'data-sorted="([^"]*)"', dom).group(1).split("|")
    assert sorted_ == sorted(first, key=str.lower) != first
