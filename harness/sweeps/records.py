"""A sweep folder's files: sweep.json (options and axes) and cells.jsonl (one record per cell).

Each finished cell appends one line to cells.jsonl (`cell_record`); the last line per key
wins, and a line torn by a kill is skipped, so an interrupted sweep resumes from its
records. `prepare` refuses to resume with options that differ from the recorded ones.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
from collections.abc import Iterable

from harness.common.cli import UsageError

SCHEMA = "harness.sweep/1"
CELL_SCHEMA = "harness.sweep.cell/1"
CELLS_FILE, SWEEP_FILE = "cells.jsonl", "sweep.json"
WARMUP_STUDY = (0, 1, 2, 5)
# Options every cell of one sweep folder must share (a resume with other values would mix them).
FIXED = ("batch", "warmup", "steps", "attention", "mode", "device", "nsys", "optimizer")
FAILED = ("oom", "error", "crashed", "timeout")


@dataclasses.dataclass(frozen=True)
class Cell:
    model: str
    ctx: int
    backend: str
    dtype: str
    warmup: int | None = None  # set only in a warm-up study; else the sweep's --warmup

    @property
    def key(self) -> str:
        """"model:ctx:backend:dtype", plus ":w<warmup>" for a warm-up study cell."""
        base = f"{self.model}:{self.ctx}:{self.backend}:{self.dtype}"
        return base if self.warmup is None else f"{base}:w{self.warmup}"


def grid(models: Iterable[str], ctxs: Iterable[int], backends: Iterable[str], dtypes: Iterable[str],
         warmup_study: bool = False) -> list[Cell]:
    """Cells in run order: model, then context, dtype and backend innermost."""
    warmups = WARMUP_STUDY if warmup_study else (None,)
    return [Cell(m, c, b, d, w) for m, c, d, b, w in itertools.product(models, ctxs, dtypes, backends, warmups)]


def cell_record(cell: Cell, status: str, reason: str | None, doc: dict | None, *, exit_code: int | None,
                wall_s: float, log: str, profile: str | None, gpu: str | None = None) -> dict:
    """One line of cells.jsonl. `result` is the harness.run document (None when the process
    left none); paths are relative to the sweep folder; `gpu` is the CUDA_VISIBLE_DEVICES
    the cell ran with under --gpus (None: the sweep's own)."""
    return {"schema": CELL_SCHEMA, "key": cell.key, "cell": dataclasses.asdict(cell), "status": status,
            "reason": reason, "exit_code": exit_code, "wall_s": wall_s, "log": log, "profile": profile,
            "gpu": gpu, "result": doc}



def load_records(out_dir: str) -> list[dict]:
    """Records of cells.jsonl, the last one per key (a torn final line is skipped)."""
    path = os.path.join(out_dir, CELLS_FILE)
    records: dict[str, dict] = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                records[rec["key"]] = rec
    return list(records.values())


def append_record(out_dir: str, record: dict) -> None:
    """Append one line and sync it; a line torn by an earlier kill is closed off first."""
    path = os.path.join(out_dir, CELLS_FILE)
    torn = False
    if os.path.exists(path) and os.path.getsize(path):
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            torn = f.read(1) != b"\n"
    with open(path, "a") as f:
        f.write(("\n" if torn else "") + json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def load_sweep(out_dir: str) -> dict:
    path = os.path.join(out_dir, SWEEP_FILE)
    if not os.path.exists(path):
        raise UsageError(f"{out_dir}: no {SWEEP_FILE}; not a sweep folder")
    with open(path) as f:
        return json.load(f)


def save_sweep(out_dir: str, sweep: dict) -> None:
    tmp = os.path.join(out_dir, f".{SWEEP_FILE}.tmp")
    with open(tmp, "w") as f:
        json.dump(sweep, f, indent=1)
    os.replace(tmp, os.path.join(out_dir, SWEEP_FILE))


def _union(old: list, new: list) -> list:
    return old + [x for x in new if x not in old]


def prepare(out_dir: str, opts: dict, axes: dict, resume: bool, warmup_study: bool) -> dict:
    """Create or (with `resume`) reopen the sweep folder; the stored grid is the union of runs."""
    exists = os.path.exists(os.path.join(out_dir, SWEEP_FILE))
    if exists and not resume:
        raise UsageError(f"{out_dir} already holds a sweep; pass --resume to continue it or choose another --out")
    if exists:
        sweep = load_sweep(out_dir)
        differ = [f"--{k.replace('_', '-')} {sweep['options'].get(k)} (now {opts[k]})" for k in FIXED
                  if sweep["options"].get(k) != opts[k]]
        if differ:
            raise UsageError(f"{out_dir} was run with {', '.join(differ)}; resume with the same options")
        sweep["axes"] = {k: _union(sweep["axes"][k], v) for k, v in axes.items()}
        sweep["warmup_study"] = sweep["warmup_study"] or warmup_study
    else:
        os.makedirs(out_dir, exist_ok=True)
        sweep = {"schema": SCHEMA, "options": opts, "axes": axes, "warmup_study": warmup_study}
    save_sweep(out_dir, sweep)
    return sweep
