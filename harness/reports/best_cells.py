"""The best whole-step MFU each backend reaches over the `harness.run` documents of a few folders,
as the median over a cell's runs, never the best run: the answer a gallery page of MFU runs
opens with (the `best-mfu` block of `doc_blocks`).

A cell is one setting of a run: its options (backend, model, attention, batch, devices, ...) and the
environment settings that change the program it times (`harness.timing.scaling.program_settings`:
XLA's flags, Inductor's options, the allocator's configuration, ...) or, on several devices, its
collectives (`comm_settings`: NCCL's), on one GPU model. A cell's runs
may come from several trees; the page that names the folders says why they run the same code
at that cell, and the table lists the trees.
`best_cells` returns the data, `best_mfu_text` renders it.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from harness.backends.parallel import short_label
from harness.common.documents import RunDocument, whole_step
from harness.common.tables import markdown_table
from harness.reports.provenance_block import tree_label
from harness.timing.scaling import comm_settings, program_settings


@dataclass
class Cell:
    """The runs of one setting: each finished run's whole-step MFU and median step time, the
    trees and folders they came from, and how many runs failed (with their status)."""

    backend: str
    batch: int
    shape: str  # model, context and dtype, as the table writes them
    gpu: str
    settings: str | None  # `program_settings` and `comm_settings`: "NAME=value, ..." or None
    devices: int = 1  # data-parallel devices; MFU is then per device
    parallel: str = ""  # the data-parallel strategy's short label, where devices > 1
    step: str = ""
    mfu: list[float] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    trees: Counter = field(default_factory=Counter)
    folders: list[str] = field(default_factory=list)
    failed: Counter = field(default_factory=Counter)

    @property
    def median_mfu(self) -> float | None:
        return statistics.median(self.mfu) if self.mfu else None


def best_cells(folders: list[Path], root: Path) -> list[Cell]:
    """Every cell of the `harness.run` documents directly in `folders`, in the order first met;
    ValueError when they hold none."""
    cells: dict[tuple, Cell] = {}
    for folder in folders:
        for path in sorted(folder.glob("*.json")):
            doc = json.loads(path.read_text())
            if not (isinstance(doc, dict) and "status" in doc and "options" in doc):
                continue
            run = RunDocument.from_dict(doc, str(path))
            env = run.get("env") or {}
            options = tuple(sorted((k, json.dumps(v)) for k, v in run.options.items()))
            o = run.options
            devices = int(o.get("data_parallel") or 1)
            settings = [program_settings(doc), comm_settings(doc) if devices > 1 else None]
            key = (options, ", ".join(s for s in settings if s) or None, env.get("gpu_name"))
            shape = f"`{o.get('model')}`, ctx {o.get('ctx')}, {o.get('dtype')}, {o.get('attention', 'naive')} attention"
            parallel = short_label(str((run.get("data_parallel") or {}).get("label") or o.get("parallel"))) \
                if devices > 1 else ""
            cell = cells.setdefault(key, Cell(backend=str(run.backend), batch=int(o.get("batch", 0)), shape=shape,
                                              gpu=str(env.get("gpu_name") or "-"), settings=key[1],
                                              devices=devices, parallel=parallel))
            where = folder.relative_to(root).as_posix()
            if where not in cell.folders:
                cell.folders.append(where)
            if not run.ok:
                cell.failed[run.status.value] += 1
                continue
            cell.step = whole_step(run.phases)
            p = run.phases[cell.step]
            if p.get("mfu") is None:
                continue
            cell.mfu.append(p["mfu"])
            cell.step_ms.append(p["median_ms"])
            cell.trees[tree_label(str(env.get("git_commit") or "no commit"))] += 1
    if not cells:
        raise ValueError(f"{', '.join(str(f) for f in folders)} hold no harness.run document")
    return list(cells.values())


def _settings_text(cell: Cell) -> str:
    return cell.settings or "defaults"


def _where(cell: Cell) -> str:
    """Where the cell ran: one GPU, or N of them and how the step is split over them."""
    if cell.devices == 1:
        return f"one {cell.gpu}"
    return f"{cell.devices} x {cell.gpu} ({cell.parallel}), per device"


def _cell_text(cell: Cell) -> str:
    return cell.shape + (f", {cell.devices} devices, {cell.parallel}" if cell.devices > 1 else "")


def _trees_text(cell: Cell) -> str:
    return ", ".join(f"{t} ({n})" if n > 1 else t for t, n in cell.trees.most_common())


def best_mfu_text(folders: list[Path], root: Path) -> str:
    """Per backend and GPU the cell with the highest median MFU, then every cell in a table:
    runs, MFU median and range, step median, trees and folders."""
    cells = best_cells(folders, root)
    measured = [c for c in cells if c.mfu]
    best: dict[tuple[str, str, int], Cell] = {}
    for c in measured:
        key = (c.backend, c.gpu, c.devices)
        if key not in best or c.median_mfu > best[key].median_mfu:
            best[key] = c
    lines = []
    for _, c in sorted(best.items()):
        lines.append(f"- {c.backend} on {_where(c)}: {c.median_mfu:.1%} at {c.shape}, batch {c.batch} "
                     f"({_settings_text(c)}; the median of {len(c.mfu)} run{'s' if len(c.mfu) > 1 else ''}"
                     + (f", {min(c.mfu):.1%}-{max(c.mfu):.1%}" if len(c.mfu) > 1 else "") + ")")
    header = ["backend", "cell", "batch", "settings", "step", "runs", "MFU: median (range)",
              "step (ms): median (range)", "trees", "folders"]
    rows = []
    for c in sorted(cells, key=lambda c: (c.gpu, c.backend, c.shape, c.devices, c.batch, c.settings or "")):
        failed = ", ".join(f"{n} {status}" for status, n in c.failed.items())
        if not c.mfu:  # every run failed, or recorded no MFU (a device with no known peak)
            rows.append([c.backend, _cell_text(c), str(c.batch), _settings_text(c), "-", failed or "no MFU recorded",
                         "-", "-", "-", ", ".join(f"`{f}/`" for f in c.folders)])
            continue
        runs = str(len(c.mfu)) + (f" (and {failed})" if failed else "")
        several = len(c.mfu) > 1
        rows.append([c.backend, _cell_text(c), str(c.batch), _settings_text(c), c.step, runs,
                     f"{c.median_mfu:.1%}" + (f" ({min(c.mfu):.1%}-{max(c.mfu):.1%})" if several else ""),
                     f"{statistics.median(c.step_ms):.1f}"
                     + (f" ({min(c.step_ms):.1f}-{max(c.step_ms):.1f})" if several else ""),
                     _trees_text(c), ", ".join(f"`{f}/`" for f in c.folders)])
    rules = ("A cell is one setting (the run's options and the settings that change the compiled program "
             "or, on several devices, its collectives) on one GPU model; its MFU is the median over its runs, "
             "each run's the whole step's (JAX's fused step) over its measured steps; with several devices, "
             "per device (the batch too).")
    return "\n".join([*lines, "", rules, "", *markdown_table(header, rows)]) + "\n"
