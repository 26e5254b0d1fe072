"""Render every result folder under results/ again from the documents it holds, answer first.

    python -m harness.regenerate [--root results]          # rewrite the generated files in place
    python -m harness.regenerate --check [--root results]  # change nothing: name each stale file, exit 1

A folder's reports are generated from its run documents; this renders each of them with
today's code, in this process, with the renderer its tool's ``--render`` uses. What is
generated is recognised by the marker files of `KINDS`, not guessed from folder names:

    kind       marker (in one folder)                           renderer (what it rewrites)
    compare    summary.json (harness.compare/) and report.md     harness.compare --render: report.md, summary.json,
                                                                 phases.png, report.html
    sweep      sweep.json and cells.jsonl                        harness.sweep --render: report.md, cells.csv,
                                                                 time_vs_ctx/phases/memory.png, report.html
    scaling    scaling[-NAME].md and runs/[NAME/]*.json          harness.scaling runs/[NAME/]*.json
                                                                 --out scaling[-NAME].md
    repeats    repeats.md and runs/**/*.json                     every start's runs: repeats.md, each cell's median
                                                                 with its range and count (harness.reports.repeats)
    diff       diff.json and diff.md                             harness.diff <compare folder> of its two labels
                                                                 (beside the diff or above it, else the one of
                                                                 that name under ROOT), or of the run documents
                                                                 of a several-runs diff (named as given,
                                                                 relative to the diff's folder), or of one
                                                                 run a side (the run documents its labels
                                                                 name, in the diff's folder or its runs/):
                                                                 diff.md, diff.json, diff.png, report.html
    attention  X.json of `harness.bench_attention`, and X.md      harness.bench_attention --render X.json: X.md, X.png
    tune       X.jsonl of `harness.tune_attention`, and X.md     harness.tune_attention --render X.jsonl: X.md
    ranks      X.json of `harness.bench_ranks`, and X.md         its table again, answer first: X.md
    gemms      X.json of `harness.bench_gemms`, and X.md         harness.bench_gemms --render X.json: X.md

Compare folders come first, since a diff reads its compare folder (which must sit under the same root, at any
depth). Then the pages beside the root (README.md and docs/**/*.md in its parent folder) and the README.md
files under it: each block between `<!-- generated: NAME ARG -->` and `<!-- end generated -->` is rendered
again from the result documents it names (`harness.reports.doc_blocks`); the rest of a page is prose and left
as it is. Everything else is not generated from a document here and is left as it is: the prose of README.md
files outside the generated blocks, logs and .txt outputs, screenshots, Nsight Compute tables, projection.md
(assembled from several `--project` commands), the report-speed benchmark against `nsys stats`, a compare
folder with no report.md beside its summary.json, and kernels.png. A compare folder's kernels.md/.csv are
rendered from its kernels.json where that document is today's (it reads back into the breakdown and writes out
the same); from an older one, whose runs did not record every figure today's tables show, kernels.md is kept
as the run wrote it and the compare report embeds it as it is.

--check renders into a temporary folder instead and compares every text output (.md, .csv,
.json, and each page with generated blocks) with the committed file byte for byte, one line
per file that differs or is missing; exit 1 when any does. It draws no figure: PNGs differ
with matplotlib's version, and so does report.html, which embeds each figure as SVG, so
neither is compared. Each file is written
whole or not at all (`harness.common.results`), so Ctrl-C or SIGTERM leaves every file
either as it was or re-rendered (exit 130). Exit status: 0 done (or, with --check, all
current), 1 a file differs or a folder cannot be rendered, 2 bad input.
"""

from __future__ import annotations

import dataclasses
import filecmp
import importlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.cli.dialect import fail, make_parser, parse_args
from harness.common.documents import COMPARE_SCHEMA, DiffDocument, DocumentError, is_document
from harness.common.results import write_text

TEXT = (".md", ".csv", ".json")  # outputs --check compares; PNG and report.html are not (see the docstring)


class Unrenderable(Exception):
    """A folder that holds a kind's markers but cannot be rendered; the message says why."""


# -- recognising the kinds ----------------------------------------------------------------
def _doc(path: Path) -> object:
    try:
        with open(path) as f:
            return json.loads(f.readline() if path.suffix == ".jsonl" else f.read())
    except (OSError, ValueError):
        return None


def _made_by(path: Path, tool: str) -> bool:
    """Whether the JSON document at `path` (a .jsonl's first line) records `tool`'s command."""
    doc = _doc(path)
    env = doc.get("environment") if isinstance(doc, dict) else None
    return isinstance(env, dict) and f"harness.{tool}" in str(env.get("command", ""))


def _rank_benches(folder: Path) -> list[Path]:
    """`harness.bench_ranks` documents with their .md beside them (the command at the top level)."""
    return [p for p in sorted(folder.glob("*.json")) if p.with_suffix(".md").is_file()
            and isinstance(doc := _doc(p), dict) and "harness.bench_ranks" in str(doc.get("command", ""))]


def _compares(folder: Path) -> list[Path]:
    doc = _doc(folder / "summary.json") if (folder / "report.md").is_file() else None
    return [folder] if is_document(doc, COMPARE_SCHEMA) else []


def _with_files(*names: str) -> Callable[[Path], list[Path]]:
    return lambda folder: [folder] if all((folder / n).exists() for n in names) else []


def _scalings(folder: Path) -> list[Path]:
    return [folder] if (folder / "runs").is_dir() and _scaling_tables(folder) else []


def _beside_md(suffix: str, tool: str) -> Callable[[Path], list[Path]]:
    return lambda folder: [p for p in sorted(folder.glob(f"*{suffix}"))
                           if p.with_suffix(".md").is_file() and _made_by(p, tool)]


# -- the renderers: (target, root of the compare folders, figures) -> files written -------
def render_compare(folder: Path, root: Path, figures: bool) -> list[Path]:
    from harness.runs.upgrade import RenderError, rerender

    try:
        return [Path(p) for p in rerender(str(folder), figures)]
    except RenderError as exc:
        raise Unrenderable(str(exc)) from None


def render_sweep(folder: Path, root: Path, figures: bool) -> list[Path]:
    from harness.reports.sweep import write_report
    from harness.sweeps.analysis import analyze

    return [folder / name for name in write_report(analyze(str(folder)), str(folder), figures)]


def _scaling_tables(folder: Path) -> dict[str, Path]:
    """scaling.md <- runs/*.json, scaling-NAME.md <- runs/NAME/*.json, for each table committed."""
    tables = {}
    for md in sorted(folder.glob("scaling*.md")):
        runs = folder / "runs" / md.stem.removeprefix("scaling").removeprefix("-")
        if runs.is_dir() and any(runs.glob("*.json")):
            tables[md.name] = runs
    return tables


def render_scaling(folder: Path, root: Path, figures: bool) -> list[Path]:
    from harness.common.errors import UsageError
    from harness.scaling import load_runs, scaling_markdown
    from harness.timing.scaling import scaling_rows

    written = []
    for name, runs in _scaling_tables(folder).items():
        try:  # as the shell expands runs/*.json: by name
            rows = scaling_rows([doc for path in sorted(runs.glob("*.json")) for doc in load_runs(str(path))])
        except (UsageError, ValueError) as exc:
            raise Unrenderable(f"{folder / name}: {exc}") from None
        write_text(folder / name, scaling_markdown(rows))
        written.append(folder / name)
    return written


def compare_folder(name: str, diff: Path, root: Path) -> Path | None:
    """The compare folder a diff's label names (`name`, as the harness named it): the nearest one
    beside the diff or a folder above it, up to `root`, else the one folder of that name under
    `root`; None when there is none or several (a gallery folder may hold its compares one level down)."""
    for above in [diff, *diff.parents]:
        if (above / name / "summary.json").is_file():
            return above / name
        if above == root or root not in above.parents:
            break
    parts = Path(name).parts  # a label led by the folders that tell it apart names them too
    found = [p.parent for p in root.rglob("summary.json") if p.parent.parts[-len(parts):] == parts]
    return found[0] if len(found) == 1 else None


def render_repeats(folder: Path, root: Path, figures: bool) -> list[Path]:
    from harness.common.errors import UsageError
    from harness.reports.repeats import load_starts, repeats_markdown
    from harness.scaling import load_runs

    try:
        text = repeats_markdown(load_starts(folder / "runs", load_runs))
    except (UsageError, ValueError) as exc:
        raise Unrenderable(f"{folder / 'repeats.md'}: {exc}") from None
    write_text(folder / "repeats.md", text)
    return [folder / "repeats.md"]


def render_diff(folder: Path, root: Path, figures: bool) -> list[Path]:
    from harness.diff import write_diff
    from harness.diffs.decompose import MismatchError, diff_runs
    from harness.diffs.inputs import InputError, distinct, resolve_one, run_documents_by_label, several_runs

    doc = _doc(folder / "diff.json")
    try:
        diff = None if doc is None else DiffDocument.from_dict(doc, str(folder / "diff.json"))
    except DocumentError as exc:
        raise Unrenderable(str(exc)) from None
    if doc is not None and (named := several_runs(doc)):
        return _render_several_runs(folder, named, figures)
    labels = [diff.a_label, diff.b_label] if diff else []
    if len(labels) == 2 and (documents := run_documents_by_label(folder, labels)):
        try:
            d = diff_runs(*distinct(*(resolve_one(str(path)) for path in documents)))
        except (InputError, MismatchError) as exc:
            raise Unrenderable(f"{folder}: {exc}") from None
        return list(write_diff(d, folder, figures).values())
    if not all(isinstance(label, str) and ":" in label for label in labels) or len(labels) != 2:
        raise Unrenderable(f"{folder / 'diff.json'}: names no two compare-folder runs (a_label, b_label: "
                           "FOLDER:BACKEND)")
    runs = []
    for label in labels:
        name, _, backend = label.rpartition(":")
        compare = compare_folder(name, folder, root)
        if compare is None:
            raise Unrenderable(f"{folder}: its compare folder {name} is not under {root}; "
                               "it is rendered from that folder's summary.json and kernels.json")
        runs.append(f"{compare}:{backend}")
    try:
        d = diff_runs(*distinct(*(resolve_one(run) for run in runs)))
    except (InputError, MismatchError) as exc:
        raise Unrenderable(f"{folder}: {exc}") from None
    return list(write_diff(d, folder, figures).values())


def _render_several_runs(folder: Path, named: tuple[list[str], list[str]], figures: bool) -> list[Path]:
    """A several-runs diff from its run documents, each name as its command gave it, run in the
    diff's folder (`harness.diff runs/a1.json,... runs/b1.json,... --out .`): the folder holds
    everything it is rendered from."""
    from harness.diff import write_diff
    from harness.diffs.decompose import MismatchError, diff_runs
    from harness.diffs.inputs import InputError, resolve_one
    from harness.diffs.repeats import representative, with_repeats

    def found(name: str) -> Path:
        if not Path(name).is_absolute() and (folder / name).is_file():
            return folder / name
        raise Unrenderable(f"{folder}: its run document {name} is not in it; run harness.diff in the diff's "
                           "folder, naming the runs inside it")

    try:
        a, b = ([dataclasses.replace(resolve_one(str(found(name))), source=name) for name in side] for side in named)
        d = with_repeats(diff_runs(representative(a), representative(b)), a, b)
    except (InputError, MismatchError) as exc:
        raise Unrenderable(f"{folder}: {exc}") from None
    return list(write_diff(d, folder, figures).values())


def render_attention(path: Path, root: Path, figures: bool) -> list[Path]:
    from harness.attention.bench import render_results

    return list(render_results(path, figures).values())


def render_markdown(module: str) -> Callable[[Path, Path, bool], list[Path]]:
    """The renderer of a tool whose report is X.md from its document X.json: `module`'s `markdown`."""
    def render(path: Path, root: Path, figures: bool) -> list[Path]:
        write_text(path.with_suffix(".md"), importlib.import_module(module).markdown(json.loads(path.read_text())))
        return [path.with_suffix(".md")]
    return render


def render_tune(path: Path, root: Path, figures: bool) -> list[Path]:
    from harness.attention.tune import read_rows, tune_markdown

    write_text(path.with_suffix(".md"), tune_markdown(*read_rows(path)))
    return [path.with_suffix(".md")]


@dataclass(frozen=True)
class Kind:
    name: str
    find: Callable[[Path], list[Path]]  # the targets (the folder, or files in it) a folder holds
    render: Callable[[Path, Path, bool], list[Path]]


# In this order: a diff reads its compare folder as rendered.
KINDS = (
    Kind("compare", _compares, render_compare),
    Kind("sweep", _with_files("sweep.json", "cells.jsonl"), render_sweep),
    Kind("scaling", _scalings, render_scaling),
    Kind("repeats", lambda f: [f] if (f / "repeats.md").is_file() and (f / "runs").is_dir() else [], render_repeats),
    Kind("diff", _with_files("diff.json", "diff.md"), render_diff),
    Kind("attention", _beside_md(".json", "bench_attention"), render_attention),
    Kind("tune", _beside_md(".jsonl", "tune_attention"), render_tune),
    Kind("ranks", _rank_benches, render_markdown("harness.bench_ranks")),
    Kind("gemms", _beside_md(".json", "bench_gemms"), render_markdown("harness.reports.gemms")),
)


def targets(root: Path) -> list[tuple[Kind, Path]]:
    """Every (kind, target) under `root`, in `KINDS` order, then by path."""
    found = []
    for folder, dirs, _ in os.walk(root):
        dirs.sort()
        found += [(i, t, kind) for i, kind in enumerate(KINDS) for t in kind.find(Path(folder))]
    return [(kind, t) for _, t, kind in sorted(found, key=lambda x: (x[0], str(x[1])))]


# -- rendering in place, or into a copy to compare ------------------------------------------
def _copy(target: Path, root: Path, scratch: Path, copied: set[Path]) -> Path:
    """`target` (a folder, or a file with the rest of its folder) copied under `scratch` at its
    place below `root`, less the figures and pages that are not compared. A folder is copied once
    (`copied` holds those that were), also where a folder inside it was copied before it: the
    folders it holds that were copied already keep what was rendered in them."""
    folder = target if target.is_dir() else target.parent
    copy = scratch / folder.relative_to(root)
    if folder not in copied:
        skip = shutil.ignore_patterns("*.png", "*.html", "*.gz")
        shutil.copytree(folder, copy, dirs_exist_ok=True, ignore=lambda where, names: set(skip(where, names)) | {
            n for n in names if Path(where) / n in copied})
        copied.add(folder)
    return copy / target.name if target.is_file() else copy


def stale(written: Sequence[Path], copy: Path, committed: Path) -> list[Path]:
    """The committed text files that the outputs `written` (below `copy`) do not match byte for byte."""
    out = []
    for path in written:
        if path.suffix in TEXT:
            mine = committed / path.relative_to(copy)
            if not (mine.is_file() and filecmp.cmp(path, mine, shallow=False)):
                out.append(mine)
    return out


def regenerate(root: Path, check: bool) -> tuple[list[str], list[Path]]:
    """Render every target under `root` (in place, or with `check` into a copy): the lines of
    the targets that could not be rendered, and (with `check`) the committed files that differ."""
    errors, differ = [], []
    copied: set[Path] = set()
    with tempfile.TemporaryDirectory(prefix="regenerate-") as scratch:
        for kind, target in targets(root):
            where = _copy(target, root, Path(scratch), copied) if check else target
            try:
                # checked, a target reads the folders it needs as rendered in the copy
                written = kind.render(where, Path(scratch) if check else root, not check)
            except (Unrenderable, KeyError, TypeError, ValueError, AttributeError, IndexError, OSError) as exc:
                said = str(exc).replace(scratch, str(root))  # a checked copy's paths as the committed ones
                # a document cut short or edited by hand: named, and the other folders still rendered
                errors.append(f"{target} ({kind.name}): " + (said if isinstance(exc, Unrenderable) else
                              f"cannot be rendered from its documents ({type(exc).__name__}: {said}); "
                              "restore them as the tool wrote them"))
                continue
            if check:
                differ += stale(written, Path(scratch), root)
            else:
                print(f"{kind.name}: {target}: {', '.join(p.name for p in written)}")
    page_errors, page_differ = regenerate_pages(root, check)
    return errors + page_errors, differ + page_differ


def regenerate_pages(root: Path, check: bool) -> tuple[list[str], list[Path]]:
    """Render the generated blocks of the pages beside `root` (README.md, docs/) from the documents
    under `root`: rewrite each page whose blocks changed, or with `check` name it instead."""
    from harness.reports.doc_blocks import BlockError, pages, render_page

    errors, differ = [], []
    repo = root.parent if root.name not in ("", ".", "..") else root.resolve().parent
    for page in pages(repo, root):
        text = page.read_text()
        try:
            new = render_page(text, str(page), root)
        except BlockError as exc:
            errors.append(f"{page} (page): {exc}")
            continue
        if new != text:
            if check:
                differ.append(page)
            else:
                write_text(page, new)
                print(f"page: {page}")
    return errors, differ


def main(argv: Sequence[str] | None = None) -> int:
    p = make_parser("harness.regenerate", __doc__)
    p.add_argument("--root", default="results", metavar="DIR", help="the folder of result folders to render")
    p.add_argument("--check", action="store_true",
                   help="write nothing: render into a temporary folder, name each committed text file that "
                        "differs, exit 1 if any")
    args = parse_args(p, argv)
    root = Path(args.root)
    if not root.is_dir():
        return fail(f"--root {args.root}: {'is a file' if root.exists() else 'no such folder'}; "
                    "name the folder of result folders (default: results)")
    try:
        errors, differ = regenerate(root, args.check)
    except KeyboardInterrupt:
        return fail("interrupted; every file is either as it was or re-rendered, none half-written", 130)
    for path in differ:
        print(f"{path}: differs from its documents' rendering; run python -m harness.regenerate")
    for line in errors:
        print(f"error: {line}", file=sys.stderr)
    return 1 if differ or errors else 0


if __name__ == "__main__":
    sys.exit(main())
