"""report.html: every table of the markdown report and every plot of its folder, inline, no network
(report and diff folders: tests/test_timeline.py checks theirs)."""

from __future__ import annotations

import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

from harness import compare, sweep
from harness.common.html import LINK_LINE, markdown_to_html

DATA = Path(__file__).parent / "data"
RESULTS = Path(__file__).parent.parent / "results"
PROFILED = RESULTS / "main-job" / "large-ctx256-bf16-h100-80gb-hbm3-profiled"


class Page(HTMLParser):
    """Tables (rows of cell texts), top-level <svg> elements and every URL-bearing attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.svgs, self.urls, self.depth = 0, [], 0
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        self.urls += [v for k, v in attrs if k in ("href", "src", "xlink:href", "action") and v]
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "svg":
            self.svgs += self.depth == 0
            self.depth += 1

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "svg":
            self.depth -= 1

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _md_tables(md: str) -> list[list[str]]:
    """Each pipe table's header row, split by hand (cells may hold an escaped bar)."""
    lines = md.splitlines()
    return [[c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
            for line, nxt in zip(lines, lines[1:]) if line.startswith("|") and re.fullmatch(r"\|[-:| ]+\|?", nxt)]


def check_page(folder: Path, markdown: str) -> Page:
    text = (folder / "report.html").read_text()
    page = Page()
    page.feed(text)
    md = (folder / markdown).read_text()
    assert LINK_LINE in md
    headers = [[re.sub(r"[`*]", "", c).replace("\\|", "|") for c in header] for header in _md_tables(md)]
    assert headers
    if "(`--detail summary`)" in md:  # a summarized kernels.md: the page holds every table of the whole report
        page_headers = iter(table[0] for table in page.tables)
        assert all(any(header == h for h in page_headers) for header in headers)
    else:
        assert [table[0] for table in page.tables] == headers
    assert page.svgs == len(list(folder.glob("*.png")))
    external = [u for u in page.urls if not u.startswith(("#", "data:")) and (":" in u or u.startswith("//"))]
    assert not external
    assert "url(http" not in text and "@import" not in text and "<script src" not in text
    return page


def test_markdown_dialect() -> None:
    md = ("# Title `x`\n\nA *b* **c** [d](d.md).\n\n- one\n- two\n  more\n\n1. first\n\n> quoted **q**\n\n"
          "```\na < b\n```\n\n| k | v |\n|---|--:|\n| a\\|b | 1 |\n")
    html = markdown_to_html(md)
    assert html.split("\n") == [
        "<h1>Title <code>x</code></h1>", '<p>A <em>b</em> <strong>c</strong> <a href="d.md">d</a>.</p>',
        "<ul><li>one</li><li>two more</li></ul>", "<ol><li>first</li></ol>",
        "<blockquote><p>quoted <strong>q</strong></p></blockquote>", "<pre><code>a &lt; b</code></pre>",
        "<table><thead><tr><th>k</th><th>v</th></tr></thead><tbody><tr><td>a|b</td><td>1</td></tr></tbody></table>"]


def test_rerendered_compare_folder(tmp_path: Path) -> None:
    folder = tmp_path / PROFILED.name
    shutil.copytree(PROFILED, folder)
    assert compare.main(["--render", str(folder)]) == 0
    page = check_page(folder, "report.md")
    assert page.svgs == 2  # phases.png drawn again, kernels.png embedded as it is
    text = (folder / "report.html").read_text()
    assert text.count("data:image/png;base64,") == 1 and "<text" in text  # phases drawn as vector, text as text


def test_sweep_folder(tmp_path: Path) -> None:
    folder = tmp_path / "sweep"
    shutil.copytree(DATA / "sweep", folder)
    assert sweep.main(["--render", str(folder)]) == 0
    page = check_page(folder, "report.md")
    assert page.svgs == 3


def test_committed_main_job_page() -> None:
    check_page(PROFILED, "report.md")
