"""Scaling over every start of a machine: each cell that ran more than once shows the median of
its starts, with their range and count, never the best of them.

A scaling folder's `runs/` holds one folder of `harness.run` documents per start of the
machine (`runs/`, `runs/round2/`, ...); a `repeat/` folder inside one holds cells run again on
that start. A cell is a backend, its data-parallel strategy with its options and settings
(`scaling.strategy`: a non-default setting is named in the row), the run's shape and N. Each
start's efficiency is taken against that start's own one-device run (`scaling.scaling_rows`);
a `repeat/` folder without a one-device run of a backend takes the one of the folder above it,
the same start (each other folder is a start of its own). The table then gives, per cell, the
median of its starts' figures (the headline) with "(lo-hi, n=K)" where K > 1:

    89.8% (87.9-91.7, n=3)

    python -m harness.regenerate    # writes repeats.md beside runs/ where the folder has one
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from harness.common.tables import markdown_table
from harness.timing.scaling import scaling_rows

Start = tuple[str, list[dict], list[dict]]  # (name, its documents, one-device documents lent by the folder above)


def _n(doc: dict) -> int:
    return (doc.get("data_parallel") or {}).get("n", 1)


def lend_one_device(docs: list[dict], above: list[dict]) -> list[dict]:
    """The one-device documents of the folder above (the same start) for the backends that `docs`
    runs on several devices without a one-device run of its own."""
    have = {d["options"]["backend"] for d in docs if _n(d) == 1}
    need = {d["options"]["backend"] for d in docs if _n(d) > 1} - have
    return [d for d in above if _n(d) == 1 and d["options"]["backend"] in need]


def start_rows(name: str, docs: list[dict], lent: list[dict]) -> list[dict]:
    """The scaling rows of one start (`scaling_rows`), less those of the lent one-device runs."""
    lent_backends = {d["options"]["backend"] for d in lent}
    rows = scaling_rows(docs + lent)
    return [{**r, "start": name} for r in rows if not (r["n"] == 1 and r["backend"] in lent_backends)]


def _key(row: dict) -> tuple:
    s = row["shape"]
    return (row["backend"], row["parallel"], *(str(s[k]) for k in sorted(s)), row["n"])


def figure(values: Sequence[float], fmt: str) -> str:
    """The median of `values`, with "(lo-hi, n=K)" where there are more than one; "-" for none."""
    if not values:
        return "-"
    if len(values) == 1:
        return fmt.format(values[0])
    lo, hi = min(values), max(values)
    bare = fmt.rstrip("%")
    return f"{fmt.format(statistics.median(values))} ({bare.format(lo)}-{bare.format(hi)}, n={len(values)})"


def cells(starts: Sequence[Start]) -> list[dict]:
    """One cell per (backend, strategy, shape, N) with the rows of every start it ran in."""
    grouped: dict[tuple, list[dict]] = defaultdict(list)
    for name, docs, lent in starts:
        for row in start_rows(name, docs, lent):
            grouped[_key(row)].append(row)
    return [{"rows": rows, **{k: rows[0][k] for k in ("backend", "parallel", "shape", "n")}}
            for _, rows in sorted(grouped.items(), key=lambda kv: tuple(map(str, kv[0][:-1])) + (kv[0][-1],))]


def _values(rows: list[dict], key: str, scale: float = 1.0) -> list[float]:
    return [scale * r[key] for r in rows if r.get(key) is not None]


def _starts(rows: list[dict]) -> str:
    return f"{len(rows)} start{'s' if len(rows) > 1 else ''}"


def repeats_markdown(starts: Sequence[Start]) -> str:
    """The table of every cell over its starts, answer first: at the largest N, each backend's
    cell of the highest median efficiency (with its loop efficiency where it has one), the
    backends in that order."""
    table = cells(starts)
    rated = [c for c in table if c["n"] > 1 and _values(c["rows"], "efficiency")]
    lines = []
    if rated:
        top_n = max(c["n"] for c in rated)
        median = {id(c): statistics.median(_values(c["rows"], "efficiency")) for c in rated}
        best: dict[str, dict] = {}
        for c in sorted((c for c in rated if c["n"] == top_n), key=lambda c: median[id(c)]):
            best[c["backend"]] = c  # the highest median of each backend comes last
        lines.append(f"At N = {top_n}, each backend's highest median efficiency over the starts:")
        for c in sorted(best.values(), key=lambda c: -median[id(c)]):
            loop = _values(c["rows"], "loop_efficiency", 100)
            lines.append(f"- {c['backend']} ({c['parallel']}): "
                         f"{figure(_values(c['rows'], 'efficiency', 100), '{:.1f}%')} over {_starts(c['rows'])}"
                         + (f"; in a loop {figure(loop, '{:.1f}%')}" if loop else ""))
        lines.append("")
    body = []
    for c in table:
        s, rows = c["shape"], c["rows"]
        body.append([c["backend"], f"{s['model']} ctx {s['ctx']} batch {s['batch']}/device {s['dtype']} "
                     f"{s['attention']} {s['device']}", c["parallel"], c["n"], ", ".join(r["start"] for r in rows),
                     figure(_values(rows, "step_ms"), "{:.1f}"),
                     figure(_values(rows, "efficiency", 100), "{:.1f}%"),
                     figure(_values(rows, "loop_efficiency", 100), "{:.1f}%")])
    header = ["backend", "run", "parallel", "N", "starts", "step ms", "efficiency", "loop efficiency"]
    note = ("Each figure is the median over the starts the cell ran in, with the range and the count where it ran "
            "more than once; each start's efficiency is against that start's one-device run (a repeat folder's, "
            "against the folder above it); step and efficiency as in scaling.md (`harness.scaling`); "
            "parallel names every non-default option and setting a cell ran with.")
    return "\n".join([*lines, *markdown_table(header, body), "", note]) + "\n"


def load_starts(runs: Path, load) -> list[Start]:
    """Every folder under `runs` holding run documents, as a start named by its path below the
    scaling folder; `load(path)` gives a file's documents."""
    starts, by_folder = [], {}
    for folder in sorted({p.parent for p in runs.rglob("*.json")}):
        docs = [doc for path in sorted(folder.glob("*.json")) for doc in load(str(path))]
        by_folder[folder] = docs
        above = by_folder.get(folder.parent, []) if folder.name == "repeat" else []  # another round: another start
        starts.append((folder.relative_to(runs.parent).as_posix(), docs, lend_one_device(docs, above)))
    return starts
