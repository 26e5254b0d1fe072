"""report.html: a result folder's markdown report as one self-contained page.

The page needs no network: CSS and the table-sorting script are inline, and every plot
is inline SVG (`svg_of` draws a plot function again into SVG; a PNG that cannot be
redrawn, say the kernel plot of a folder re-rendered from its files, is embedded in an
``<svg>`` as a data URI). `markdown_to_html` converts the markdown dialect the harness
writes, no more: ATX headings, paragraphs, ``-``/``*``/``1.`` lists, pipe tables, fenced
code, ``>`` quotes, and inline code, bold, italics, links and images. Images a report
names (``![phases](phases.png)``) are replaced by their SVG where they stand; the folder's
other PNGs follow in a last section, so every plot of the folder is on the page.
"""

from __future__ import annotations

import base64
import html
import re
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from harness.common.results import write_text

HTML_NAME = "report.html"
LINK_LINE = f"[{HTML_NAME}]({HTML_NAME}): this report as one self-contained page (sortable tables, vector plots)."

_STYLE = """body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1200px;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.8em 0;font-size:13px;display:block;overflow-x:auto}
th,td{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top}
th{background:#f3f3f3;cursor:pointer;user-select:none;position:sticky;top:0}
th.asc::after{content:" \\25B2"}th.desc::after{content:" \\25BC"}
tr:nth-child(even) td{background:#fafafa}
code{background:#f3f3f3;padding:0 3px;border-radius:3px}pre{background:#f6f6f6;padding:.6em;overflow-x:auto}
blockquote{border-left:4px solid #ccc;margin:.5em 0;padding:.1em 1em;color:#444}
figure{margin:1em 0}figure svg{max-width:100%;height:auto}"""

# Click a header to sort its table's rows by that column (numbers as numbers), again to reverse.
_SCRIPT = """document.querySelectorAll("table").forEach(function(t){
 t.querySelectorAll("th").forEach(function(th,i){th.addEventListener("click",function(){
  var asc=!th.classList.contains("asc"),body=t.tBodies[0];
  t.querySelectorAll("th").forEach(function(h){h.classList.remove("asc","desc")});
  th.classList.add(asc?"asc":"desc");
  var key=function(r){var s=r.cells[i]?r.cells[i].textContent.trim():"";
   var n=parseFloat(s.replace(/[,%x]/g,""));return isNaN(n)?s.toLowerCase():n};
  Array.from(body.rows).sort(function(a,b){var x=key(a),y=key(b);
   var c=(typeof x===typeof y)?(x<y?-1:x>y?1:0):(typeof x==="number"?-1:1);return asc?c:-c})
   .forEach(function(r){body.appendChild(r)})})})});"""

# code | image | link | bold | italics
_INLINE = re.compile(r"`([^`]+)`|!\[([^\]]*)\]\(([^)\s]+)\)|\[([^\]]+)\]\(([^)\s]+)\)|\*\*(.+?)\*\*"
                     r"|(?<!\w)\*(?!\s)(.+?)\*(?!\w)")


def _inline(text: str, images: Mapping[str, str]) -> str:
    out, pos = [], 0
    for m in _INLINE.finditer(text):
        out.append(html.escape(text[pos:m.start()], quote=False))
        code, alt, src, label, href, bold, em = m.groups()
        if code is not None:
            out.append(f"<code>{html.escape(code, quote=False)}</code>")
        elif src is not None:
            out.append(f'<figure aria-label="{html.escape(alt)}">{images[src]}</figure>' if src in images
                       else html.escape(m.group(0), quote=False))
        elif label is not None:
            out.append(f'<a href="{html.escape(href)}">{_inline(label, images)}</a>')
        elif bold is not None:
            out.append(f"<strong>{_inline(bold, images)}</strong>")
        else:
            out.append(f"<em>{_inline(em, images)}</em>")
        pos = m.end()
    out.append(html.escape(text[pos:], quote=False))
    return "".join(out)


def _cells(line: str) -> list[str]:
    """A pipe-table row's cells; ``\\|`` is a literal bar inside a cell."""
    row = line.strip().removeprefix("|")
    if row.endswith("|") and not row.endswith("\\|"):
        row = row[:-1]
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", row)]


def _is_rule(line: str) -> bool:
    return bool(re.fullmatch(r"\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*", line))


def markdown_to_html(md: str, images: Mapping[str, str] | None = None) -> str:
    """The HTML body of `md`; `images` maps an image's file name to its inline markup."""
    images = images or {}
    lines, out, i = md.splitlines(), [], 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
        elif line.startswith("```"):
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), len(lines))
            out.append("<pre><code>" + html.escape("\n".join(lines[i + 1:end]), quote=False) + "</code></pre>")
            i = end + 1
        elif m := re.match(r"(#{1,6})\s+(.*)", line):
            level = len(m.group(1))
            out.append(f"<h{level}>{_inline(m.group(2).strip(), images)}</h{level}>")
            i += 1
        elif line.lstrip().startswith("|") and i + 1 < len(lines) and _is_rule(lines[i + 1]):
            end = i + 2
            while end < len(lines) and lines[end].lstrip().startswith("|"):
                end += 1
            head = "".join(f"<th>{_inline(c, images)}</th>" for c in _cells(line))
            rows = "".join("<tr>" + "".join(f"<td>{_inline(c, images)}</td>" for c in _cells(r)) + "</tr>"
                           for r in lines[i + 2:end])
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
            i = end
        elif re.match(r"\s*([-*]|\d+\.)\s", line):
            ordered = bool(re.match(r"\s*\d+\.", line))
            items = []
            while i < len(lines) and lines[i].strip():
                if m := re.match(r"\s*(?:[-*]|\d+\.)\s+(.*)", lines[i]):
                    items.append(m.group(1))
                elif items:
                    items[-1] += " " + lines[i].strip()
                i += 1
            tag = "ol" if ordered else "ul"
            out.append(f"<{tag}>" + "".join(f"<li>{_inline(x, images)}</li>" for x in items) + f"</{tag}>")
        elif line.startswith(">"):
            quoted = []
            while i < len(lines) and lines[i].startswith(">"):
                quoted.append(lines[i][1:].removeprefix(" "))
                i += 1
            out.append(f"<blockquote>{markdown_to_html(chr(10).join(quoted), images)}</blockquote>")
        else:
            para = []
            while i < len(lines) and lines[i].strip() and not re.match(r"#{1,6}\s|```|>|\s*\|", lines[i]):
                para.append(lines[i].strip())
                i += 1
            if not para:  # a lone table-looking line without its rule: keep it as text
                para, i = [line.strip()], i + 1
            text = _inline(" ".join(para), images)
            out.append(text if text.startswith("<figure") and text.endswith("</figure>") else f"<p>{text}</p>")
    return "\n".join(out)


def page(title: str, body: str) -> str:
    """A whole HTML document around `body`, with the inline style and sorting script."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{_STYLE}</style></head><body>\n{body}\n<script>{_SCRIPT}</script></body></html>\n")


def svg_of(plot: Callable[[str], object]) -> str | None:
    """The SVG markup of what `plot(path)` draws with matplotlib (text kept as text,
    deterministic ids), None when it draws nothing."""
    import matplotlib

    with tempfile.TemporaryDirectory() as tmp, matplotlib.rc_context({"svg.fonttype": "none",
                                                                       "svg.hashsalt": "xfprof"}):
        path = Path(tmp) / "plot.svg"
        if plot(str(path)) is False or not path.exists():
            return None
        return path.read_text()


def _clean_svg(svg: str, prefix: str) -> str:
    """`svg` fit to sit inline: no XML prolog, doctype or metadata, ids prefixed so that
    several plots on a page keep their own clip paths."""
    svg = svg[svg.index("<svg"):]
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.S)
    for ident in set(re.findall(r'\bid="([^"]+)"', svg)):
        svg = re.sub(rf'(\bid="|url\(#|href="#){re.escape(ident)}(["\)])', rf"\g<1>{prefix}-{ident}\g<2>", svg)
    return svg


def _png_svg(path: Path) -> str:
    """A PNG inside an <svg>, as a data URI (for plots that cannot be redrawn)."""
    data = path.read_bytes()
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    uri = "data:image/png;base64," + base64.b64encode(data).decode()
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}"><image width="{width}" height="{height}" href="{uri}"/></svg>')


def write_html(folder: str | Path, markdown_name: str, svgs: Mapping[str, str | None] | None = None,
               link: bool = True, text: str | None = None) -> Path:
    """Write `folder`/report.html from `folder`/`markdown_name` (or from `text`, where the page
    holds more than the file: a summary's full tables) and the folder's plots (`svgs`: PNG
    name -> SVG markup drawn for it; others are embedded); with `link`, the markdown
    gets a line pointing at the page. Returns the page's path."""
    folder = Path(folder)
    md_path = folder / markdown_name
    md = md_path.read_text() if text is None else text
    images = {}
    for n, png in enumerate(sorted(folder.glob("*.png"))):
        svg = (svgs or {}).get(png.name) or _png_svg(png)
        images[png.name] = _clean_svg(svg, f"plot{n}")
    named = set(re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", md))
    body = markdown_to_html(md.replace(LINK_LINE, ""), images)
    rest = [name for name in images if name not in named]
    if rest:
        body += "\n<h2>Plots</h2>\n" + "\n".join(f'<figure aria-label="{html.escape(name)}">{images[name]}</figure>'
                                                   for name in rest)
    title = next((line.lstrip("# ").strip() for line in md.splitlines() if line.startswith("#")), markdown_name)
    path = folder / HTML_NAME
    write_text(path, page(title, body))
    if link and LINK_LINE not in (own := md_path.read_text()):
        write_text(md_path, with_link(own))
    return path


def with_link(md: str) -> str:
    """`md` ending in the line that points at report.html, as `write_html` leaves it: for a
    renderer to write its markdown whole at once, link included, rather than in two writes."""
    return md if LINK_LINE in md else md.rstrip("\n") + "\n\n" + LINK_LINE + "\n"
