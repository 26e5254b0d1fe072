"""A sweep folder's files: sweep.json (options and axes) and cells.jsonl (one record per cell).

Each finished cell appends one line to cells.jsonl (`cell_record`); the last line per key
wins, and a line torn by a kill is skipped, so an interrupted sweep resumes from its
records. `prepare` refuses to resume with options that differ from the recorded ones, and
says which axis values a resume adds to the grid.

Batch is an axis: the sweep's first batch is its base batch (`options["batch"]`), whose
cells keep the key "model:ctx:backend:dtype" of sweeps from before the axis existed; a
cell at another batch N is keyed "model:ctx:backend:dtype:bN". The device count of
`--data-parallel` is an axis the same way: N = 1 keeps the key, N > 1 adds ":dpN".
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterable

from harness.common.documents import SWEEP_SCHEMA, RunDocument, Status, SweepCell
from harness.common.errors import UsageError
from harness.common.provenance import source_digest

CELLS_FILE, SWEEP_FILE = "cells.jsonl", "sweep.json"
WARMUP_STUDY = (0, 1, 2, 5)
# Options every cell of one sweep folder must share (a resume with other values would mix them).
FIXED = ("warmup", "steps", "attention", "mode", "device", "nsys", "optimizer", "parallel", "ddp_bucket_mb",
         "ddp_static_graph", "grad_comm", "fsdp_reshard_after_forward")
FIXED_DEFAULTS = {"parallel": "ddp", "ddp_bucket_mb": None, "ddp_static_graph": False, "grad_comm": "fp32",
                  "fsdp_reshard_after_forward": "true"}  # what a sweep from before an option ran with
AXES = ("models", "ctx", "batches", "backends", "dtypes", "data_parallel")


@dataclasses.dataclass(frozen=True)
class Cell:
    model: str
    ctx: int
    backend: str
    dtype: str
    warmup: int | None = None  # set only in a warm-up study; else the sweep's --warmup
    batch: int | None = None  # set only off the sweep's base batch
    data_parallel: int | None = None  # devices, set only above 1

    @property
    def key(self) -> str:
        """"model:ctx:backend:dtype", plus ":b<batch>" off the base batch, ":dp<N>" on N > 1
        devices and ":w<warmup>" for a warm-up study cell."""
        key = f"{self.model}:{self.ctx}:{self.backend}:{self.dtype}"
        key += "" if self.batch is None else f":b{self.batch}"
        key += "" if self.data_parallel is None else f":dp{self.data_parallel}"
        return key if self.warmup is None else f"{key}:w{self.warmup}"


def grid(models: Iterable[str], ctxs: Iterable[int], backends: Iterable[str], dtypes: Iterable[str],
         warmup_study: bool = False, batches: Iterable[int] = (), base_batch: int | None = None,
         data_parallel: Iterable[int] = ()) -> list[Cell]:
    """Cells in run order: model, then context, batch, device count, dtype and backend
    innermost. A batch equal to `base_batch` (or no `batches` at all) is the sweep's base
    batch; no `data_parallel` is one device."""
    warmups = WARMUP_STUDY if warmup_study else (None,)
    sizes = [None if b == base_batch else b for b in batches] or [None]
    devices = [None if n == 1 else n for n in data_parallel] or [None]
    return [Cell(m, c, b, d, w, n, dp)
            for m, c, n, dp, d, b, w in itertools.product(models, ctxs, sizes, devices, dtypes, backends, warmups)]


def sweep_batches(sweep: dict) -> list[int]:
    """The batch axis of a sweep (sweeps from before the axis: the one batch of its options)."""
    return sweep["axes"].get("batches") or [sweep["options"]["batch"]]


def sweep_data_parallel(sweep: dict) -> list[int]:
    """The device-count axis of a sweep (sweeps from before the axis: one device)."""
    return sweep["axes"].get("data_parallel") or [1]


def cell_record(cell: Cell, status: Status, reason: str | None, doc: dict | None, *, exit_code: int | None,
                wall_s: float, log: str, profile: str | None, gpu: str | None = None) -> dict:
    """One line of cells.jsonl (`SweepCell`). `result` is the harness.run document (None when
    the process left none); paths are relative to the sweep folder; `gpu` is the
    CUDA_VISIBLE_DEVICES the cell ran with under --gpus (None: the sweep's own)."""
    result = None if doc is None else RunDocument.from_dict(doc, f"the run document of cell {cell.key}")
    return SweepCell(key=cell.key, cell=dataclasses.asdict(cell), status=Status(status), reason=reason,
                     exit_code=exit_code, wall_s=wall_s, log=log, profile=profile, gpu=gpu, result=result).to_dict()



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


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def other_trees(out_dir: str) -> str | None:
    """One line where recorded cells of the sweep ran source other than this tree's (the code
    edited between the sweep and its resume): the report then holds cells of both, and its
    rows do not say which; None where every recorded cell ran this source."""
    here = source_digest()
    ran = (((rec.get("result") or {}).get("env") or {}).get("source_sha256") for rec in load_records(out_dir))
    others = Counter(digest[:7] for digest in ran if digest not in (None, here))
    if not others:
        return None
    ran = ", ".join(f"{n} ran source {digest}" for digest, n in sorted(others.items()))
    return (f"[sweep] --resume: recorded cells of {out_dir} ran other code than this tree's (source {here[:7]}): "
            f"{ran}; the report will hold both")


def prepare(out_dir: str, opts: dict, axes: dict, resume: bool, warmup_study: bool,
            log: Callable[[str], None] = _stderr) -> dict:
    """Create or (with `resume`) reopen the sweep folder; the stored grid is the union of
    runs, and `log` gets one line listing what a resume adds to it. `opts["batch"]` is
    the base batch of a new sweep (a resumed one keeps its own); `axes` holds AXES."""
    exists = os.path.exists(os.path.join(out_dir, SWEEP_FILE))
    if exists and not resume:
        raise UsageError(f"{out_dir} already holds a sweep; pass --resume to continue it or choose another --out")
    if resume and not exists:
        raise UsageError(f"--resume: {out_dir} holds no sweep (no {SWEEP_FILE}); drop --resume to start one there, "
                         "or name the sweep folder with --out")
    if exists:
        sweep = load_sweep(out_dir)
        was, now = ({k: o.get(k, FIXED_DEFAULTS.get(k)) for k in FIXED} for o in (sweep["options"], opts))
        differ = [f"--{k.replace('_', '-')} {was[k]} (now {now[k]})" for k in FIXED if was[k] != now[k]]
        if differ:
            raise UsageError(f"{out_dir} was run with {', '.join(differ)}; resume with the same options")
        old = {**sweep["axes"], "batches": sweep_batches(sweep), "data_parallel": sweep_data_parallel(sweep)}
        added = {k: [x for x in v if x not in old[k]] for k, v in axes.items()}
        if any(added.values()):
            log(f"[sweep] --resume adds to the grid of {out_dir}: "
                + "; ".join(f"{k} {', '.join(map(str, v))}" for k, v in added.items() if v))
        sweep["axes"] = {k: _union(old[k], v) for k, v in axes.items()}
        sweep["warmup_study"] = sweep["warmup_study"] or warmup_study
        if line := other_trees(out_dir):
            log(line)
    else:
        os.makedirs(out_dir, exist_ok=True)
        sweep = {"schema": SWEEP_SCHEMA, "options": opts, "axes": axes, "warmup_study": warmup_study}
    save_sweep(out_dir, sweep)
    return sweep
