"""Sweep models x context lengths x backends x dtypes, one `harness.run` subprocess per cell.

    python -m harness.sweep --models small,medium --ctx 128,256,512 [--backends torch,jax]
        [--dtype fp32,bf16] [--nsys] [--warmup-study] [--resume] [--gpus 0,1] [--out results/<sweep>/]
    python -m harness.sweep --render results/<sweep>/

Each finished cell appends one line to <out>/cells.jsonl (see `cell_record`), so an
interrupted sweep continues with --resume without redoing any recorded cell. A cell that
runs out of memory, crashes, dies by a signal or passes --cell-timeout is recorded with
its reason and the sweep goes on; the exit code is 3 when any cell of the sweep failed
(0 otherwise, 2 for bad input). The report (report.md, cells.csv, plots) is rendered from
cells.jsonl by `harness.sweep_report` after every sweep, or alone with --render.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable

from harness.cli import BACKENDS, DTYPES, MODES, UsageError, choice, fail, non_negative_int, parse_args, \
    positive_int, select_platform
from harness.config import ATTENTION_CHOICES, PRESETS, get_config
from harness.memory_model import predict

SCHEMA = "harness.sweep/1"
CELL_SCHEMA = "harness.sweep.cell/1"
CELLS_FILE, SWEEP_FILE = "cells.jsonl", "sweep.json"
WARMUP_STUDY = (0, 1, 2, 5)
RUN_PHASES = ("forward", "backward", "optimizer", "step", "fused_step")
# Options every cell of one sweep folder must share (a resume with other values would mix them).
FIXED = ("batch", "warmup", "steps", "attention", "mode", "device", "nsys")
FAILED = ("oom", "error", "crashed", "timeout")
DEFAULT_DEVICE_GB = 80


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


# -- running one cell ------------------------------------------------------------------
def cell_command(cell: Cell, opts: dict, out_json: str, fail_in: str | None = None) -> list[str]:
    """The `harness.run` argv of one cell."""
    attention = "fused" if cell.backend == "torch" and opts["attention"] == "pallas" else opts["attention"]
    warmup = opts["warmup"] if cell.warmup is None else cell.warmup
    cmd = [sys.executable, "-m", "harness.run", "--backend", cell.backend, "--model", cell.model,
           "--ctx", str(cell.ctx), "--batch", str(opts["batch"]), "--dtype", cell.dtype, "--attention", attention,
           "--device", opts["device"], "--mode", opts["mode"], "--warmup", str(warmup), "--steps", str(opts["steps"]),
           "--out", out_json]
    return cmd + (["--fail-in", fail_in] if fail_in else [])


def _tail(path: str, lines: int = 3) -> str:
    with open(path, errors="replace") as f:
        return " | ".join(line.strip() for line in f.read().strip().splitlines()[-lines:])


class CellProcess:
    """One cell's subprocess, in its own process group, stdout and stderr to a log file.

    `env` and `cpus` pin it to one GPU and a slice of the CPUs when cells run side by side."""

    def __init__(self, cmd: list[str], log_path: str, timeout: float | None, *,
                 env: dict[str, str] | None = None, cpus: set[int] | None = None) -> None:
        self._log = open(log_path, "w")
        preexec = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env=env, preexec_fn=preexec)
        self.started = time.monotonic()
        self.deadline = None if timeout is None else self.started + timeout

    def poll(self) -> tuple[int | None, bool] | None:
        """None while running; else (exit code, timed out), killing the group on a timeout."""
        code = self.proc.poll()
        if code is None and (self.deadline is None or time.monotonic() < self.deadline):
            return None
        if code is None:
            self.kill()
            return None, True
        self._log.close()
        return code, False

    def wait(self) -> tuple[int | None, bool]:
        """Block until the process ends or times out; (exit code, timed out). A negative
        code is the signal that ended it. An interrupt kills the group and is re-raised."""
        try:
            while (done := self.poll()) is None:
                time.sleep(0.05)
        except BaseException:
            self.kill()
            raise
        return done

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._log.close()


def outcome(doc: dict | None, code: int | None, timed_out: bool, timeout: float | None, log_path: str) -> tuple[str, str | None]:
    """(status, reason) of a finished cell: the run's own verdict if it wrote one, else why not."""
    if doc is not None:
        return doc["status"], (doc.get("error") or {}).get("message")
    if timed_out:
        return "timeout", f"no result within --cell-timeout {timeout:g} s (killed)"
    if code is not None and code < 0:
        return "crashed", f"killed by signal {signal.Signals(-code).name}, no result; log: {_tail(log_path)}"
    return "crashed", f"exit code {code}, no result; log: {_tail(log_path)}"


def cell_record(cell: Cell, status: str, reason: str | None, doc: dict | None, *, exit_code: int | None,
                wall_s: float, log: str, profile: str | None, gpu: str | None = None) -> dict:
    """One line of cells.jsonl. `result` is the harness.run document (None when the process
    left none); paths are relative to the sweep folder; `gpu` is the CUDA_VISIBLE_DEVICES
    the cell ran with under --gpus (None: the sweep's own)."""
    return {"schema": CELL_SCHEMA, "key": cell.key, "cell": dataclasses.asdict(cell), "status": status,
            "reason": reason, "exit_code": exit_code, "wall_s": wall_s, "log": log, "profile": profile,
            "gpu": gpu, "result": doc}


@dataclasses.dataclass
class StartedCell:
    cell: Cell
    job: CellProcess
    out_dir: str
    out_json: str  # relative to out_dir
    log: str
    report: str | None  # nsys report stem, when profiled
    gpu: str | None
    timeout: float | None


def start_cell(cell: Cell, opts: dict, out_dir: str, *, timeout: float | None = None, fail_in: str | None = None,
               gpu: str | None = None, cpus: set[int] | None = None) -> StartedCell:
    """Start one cell's subprocess (under nsys when opts["nsys"]), on GPU `gpu` if given."""
    name = cell.key.replace(":", "_")
    for sub in ("runs", "logs"):
        os.makedirs(os.path.join(out_dir, sub), exist_ok=True)
    out_json, log = os.path.join("runs", f"{name}.json"), os.path.join("logs", f"{name}.log")
    cmd = cell_command(cell, opts, os.path.join(out_dir, out_json), fail_in)
    report = os.path.join(out_dir, "runs", name) if opts["nsys"] else None
    if report:
        from harness.nsys import profile_command

        cmd = profile_command(cell.backend, report, cmd)
    if os.path.exists(os.path.join(out_dir, out_json)):
        os.remove(os.path.join(out_dir, out_json))  # left by an interrupted attempt
    env = None if gpu is None else {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
    job = CellProcess(cmd, os.path.join(out_dir, log), timeout, env=env, cpus=cpus)
    return StartedCell(cell, job, out_dir, out_json, log, report, gpu, timeout)


def finish_cell(started: StartedCell, code: int | None, timed_out: bool) -> dict:
    """The record of a cell whose process has ended."""
    s = started
    wall = time.monotonic() - s.job.started
    doc = None
    if os.path.exists(os.path.join(s.out_dir, s.out_json)):
        with open(os.path.join(s.out_dir, s.out_json)) as f:
            doc = json.load(f)
    status, reason = outcome(doc, code, timed_out, s.timeout, os.path.join(s.out_dir, s.log))
    profile = _export_profile(s.report) if s.report and os.path.exists(f"{s.report}.nsys-rep") else None
    return cell_record(s.cell, status, reason, doc, exit_code=code, wall_s=wall, log=s.log, gpu=s.gpu,
                       profile=os.path.relpath(profile, s.out_dir) if profile else None)


def run_cell(cell: Cell, opts: dict, out_dir: str, *, timeout: float | None = None,
             fail_in: str | None = None) -> dict:
    """Run one cell to its end and return its record."""
    started = start_cell(cell, opts, out_dir, timeout=timeout, fail_in=fail_in)
    return finish_cell(started, *started.job.wait())


def _export_profile(report: str) -> str | None:
    from harness.nsys import ProfileError, export_sqlite

    try:
        return str(export_sqlite(f"{report}.nsys-rep"))
    except ProfileError as exc:
        print(f"[sweep] {exc}", file=sys.stderr)
        return None


# -- the results file ------------------------------------------------------------------
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
        differ = [f"--{k.replace('_', '-')} {sweep['options'][k]} (now {opts[k]})" for k in FIXED
                  if sweep["options"][k] != opts[k]]
        if differ:
            raise UsageError(f"{out_dir} was run with {', '.join(differ)}; resume with the same options")
        sweep["axes"] = {k: _union(sweep["axes"][k], v) for k, v in axes.items()}
        sweep["warmup_study"] = sweep["warmup_study"] or warmup_study
    else:
        os.makedirs(out_dir, exist_ok=True)
        sweep = {"schema": SCHEMA, "options": opts, "axes": axes, "warmup_study": warmup_study}
    save_sweep(out_dir, sweep)
    return sweep


# -- the sweep -------------------------------------------------------------------------
def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def progress_line(done: int, running: list[str], left: int, walls: list[float], slots: int = 1) -> str:
    """Cells done, those running, cells left (not counting them) and the time left, from the
    mean wall time of the finished cells spread over `slots` GPUs."""
    if walls:
        eta = f"~{_duration(sum(walls) / len(walls) * (left + len(running)) / slots)} left"
    else:
        eta = "time left: after the first cell"
    run = f", running {', '.join(running)}" if running else ""
    return f"{done} done{run}, {left} left, {eta}"


def longest_first(cells: list[Cell]) -> list[Cell]:
    """Cells ordered by a rough cost (step FLOPs, JAX's compilation counted as a multiple),
    so that side-by-side cells end together instead of one GPU finishing a big cell alone."""
    from harness.flops import forward_flops

    def cost(cell: Cell) -> float:
        return forward_flops(get_config(cell.model), 1, cell.ctx) * (3 if cell.backend == "jax" else 1)

    return sorted(cells, key=cost, reverse=True)


def cpu_slices(n: int) -> list[set[int] | None]:
    """This process's CPUs split into `n` disjoint equal slices (None each if too few)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    size = len(cpus) // n
    if n == 1 or size == 0:
        return [None] * n
    return [set(cpus[i * size:(i + 1) * size]) for i in range(n)]


def run_sweep(cells: list[Cell], opts: dict, out_dir: str, *, timeout: float | None = None,
              max_cells: int | None = None, fail_cell: str | None = None, gpus: list[str] | None = None,
              log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)) -> None:
    """Run the cells not yet recorded in `out_dir`, appending each record as it finishes.

    `gpus` runs one cell per listed GPU side by side (CUDA_VISIBLE_DEVICES), each pinned to
    its own equal slice of the CPUs so a launch-bound eager run does not compete with a
    compiling one, longest cells first; without it, cells run one at a time in grid order
    on the default device. `max_cells` stops after that many cells (resume later);
    `fail_cell` "KEY:PHASE" makes that cell simulate an out-of-memory in PHASE
    (harness.run --fail-in)."""
    recorded = {r["key"] for r in load_records(out_dir)}
    pending = [c for c in cells if c.key not in recorded]
    done = len(cells) - len(pending)
    if done:
        log(f"[sweep] {done} of {len(cells)} cells already recorded in {out_dir}; skipping them")
    todo = pending[:max_cells] if max_cells is not None else pending
    fail_key, _, fail_phase = (fail_cell or "").rpartition(":")
    if gpus and len(gpus) > 1:
        todo = longest_first(todo)
    slots: list[str | None] = list(gpus) if gpus else [None]
    cpus = dict(zip(slots, cpu_slices(len(slots)))) if gpus else {None: None}
    running: dict[str | None, StartedCell] = {}
    walls: list[float] = []
    queue = list(todo)
    finished = 0
    try:
        while queue or running:
            for gpu in [g for g in slots if g not in running]:
                if not queue:
                    break
                cell = queue.pop(0)
                running[gpu] = start_cell(cell, opts, out_dir, timeout=timeout, gpu=gpu, cpus=cpus[gpu],
                                          fail_in=fail_phase if cell.key == fail_key else None)
                where = f" on GPU {gpu}" if gpu is not None else ""
                log(f"[sweep] started {cell.key}{where}; "
                    f"{progress_line(done + finished, [s.cell.key for s in running.values()], len(pending) - finished - len(running), walls, len(slots))}")
            time.sleep(0.05)
            for gpu, started in list(running.items()):
                if (result := started.job.poll()) is None:
                    continue
                del running[gpu]
                rec = finish_cell(started, *result)
                append_record(out_dir, rec)
                walls.append(rec["wall_s"])
                finished += 1
                detail = f": {rec['reason']}" if rec["reason"] else ""
                log(f"[sweep] {rec['key']} {rec['status']} in {rec['wall_s']:.1f} s{detail}")
    except BaseException:
        for started in running.values():
            started.job.kill()
        raise
    left = len(pending) - len(todo)
    log(f"[sweep] stopped after {len(todo)} cells (--max-cells); "
        f"{progress_line(done + len(todo), [], left, walls, len(slots))}; continue with --resume"
        if left else f"[sweep] all {len(cells)} cells recorded")


# -- analysis: lists of dicts for the report ---------------------------------------------
def _order(cell: dict) -> tuple:
    models = list(PRESETS)
    return (models.index(cell["model"]) if cell["model"] in models else len(models), cell["ctx"],
            DTYPES.index(cell["dtype"]), BACKENDS.index(cell["backend"]), cell["warmup"] or 0)


def sweep_cells(sweep: dict, records: list[dict]) -> list[dict]:
    """Every cell of the stored grid, in report order: its record, or status "not run"."""
    a = sweep["axes"]
    by_key = {r["key"]: r for r in records}
    cells = grid(a["models"], a["ctx"], a["backends"], a["dtypes"])
    if sweep.get("warmup_study"):
        cells += grid(a["models"][:1], a["ctx"][:1], a["backends"], a["dtypes"][:1], warmup_study=True)
    keys = {c.key for c in cells}
    out = [by_key.get(c.key) or {"key": c.key, "cell": dataclasses.asdict(c), "status": "not run",
                                  "reason": None, "result": None, "profile": None} for c in cells]
    out += [r for r in records if r["key"] not in keys]  # recorded under an earlier grid
    return sorted(out, key=lambda r: _order(r["cell"]))


def _phase(rec: dict, name: str) -> dict | None:
    return (rec.get("result") or {}).get("phases", {}).get(name) if rec["status"] == "ok" else None


def phase_rows(cells: list[dict]) -> list[dict]:
    """Per main cell: status and, per phase, median/std ms, TFLOP/s, MFU and peak bytes."""
    rows = []
    for rec in cells:
        if rec["cell"]["warmup"] is not None:
            continue
        row = {**rec["cell"], "key": rec["key"], "status": rec["status"], "reason": rec["reason"]}
        for name in RUN_PHASES:
            row[name] = _phase(rec, name)
        fwd, bwd = row["forward"], row["backward"]
        row["bwd_over_fwd"] = bwd["median_ms"] / fwd["median_ms"] if fwd and bwd else None
        rows.append(row)
    return rows


def ratio_rows(rows: list[dict]) -> list[dict]:
    """JAX over torch median per model x ctx x dtype and phase; `fused_step` is JAX's fused
    step over torch's step. A value is None where either side has no number; `status`
    then says why ("OOM" or "failed", of either side)."""
    index = {(r["model"], r["ctx"], r["dtype"], r["backend"]): r for r in rows}
    out = []
    for (model, ctx, dtype, backend), t in index.items():
        j = index.get((model, ctx, dtype, "jax"))
        if backend != "torch" or j is None:
            continue
        row = {"model": model, "ctx": ctx, "dtype": dtype, "status": _pair_status(t, j)}
        for name in RUN_PHASES:
            tp = t["step" if name == "fused_step" else name]
            jp = j[name]
            row[name] = jp["median_ms"] / tp["median_ms"] if tp and jp else None
        out.append(row)
    return out


def _pair_status(*rows: dict) -> str:
    statuses = {r["status"] for r in rows}
    if statuses == {"ok"}:
        return "ok"
    return "OOM" if "oom" in statuses else "not run" if statuses <= {"ok", "not run"} else "failed"


def bound_label(ratio: float | None) -> str | None:
    """Backward over forward: about 1x when memory-bound, toward 2x when compute-bound
    (backward does twice the forward's matmul FLOPs)."""
    if ratio is None:
        return None
    return "memory-bound" if ratio < 1.35 else "compute-bound" if ratio >= 1.7 else "in between"


def bound_notes(rows: list[dict]) -> list[dict]:
    """Per backend x dtype x model: the backward/forward ratio over context and the first
    context where it reaches 1.5x (None when it never does)."""
    series: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["bwd_over_fwd"] is not None:
            series.setdefault((r["backend"], r["dtype"], r["model"]), []).append(r)
    notes = []
    for (backend, dtype, model), rs in series.items():
        rs = sorted(rs, key=lambda r: r["ctx"])
        cross = next((r["ctx"] for r in rs if r["bwd_over_fwd"] >= 1.5), None)
        notes.append({"backend": backend, "dtype": dtype, "model": model,
                      "ratios": [(r["ctx"], r["bwd_over_fwd"]) for r in rs], "reaches_1_5x_at": cross,
                      "first": bound_label(rs[0]["bwd_over_fwd"]), "last": bound_label(rs[-1]["bwd_over_fwd"])})
    return notes


def device_memory_bytes(cells: list[dict], gb: float | None = None) -> tuple[int, str]:
    """Device memory for the fit prediction: `gb` (GiB) when given, else "<N>GB" in a run's
    device name (e.g. "NVIDIA H100 80GB HBM3"), else 80 GiB."""
    if gb is not None:
        return int(gb * 2**30), f"{gb:g} GiB (--device-memory-gb)"
    for rec in cells:
        name = ((rec.get("result") or {}).get("env") or {}).get("device") or ""
        m = re.search(r"(\d+)\s*GB", name)
        if m:
            return int(m.group(1)) * 2**30, f"{m.group(1)} GiB, from the device name {name!r}"
    return DEFAULT_DEVICE_GB * 2**30, f"{DEFAULT_DEVICE_GB} GiB (default; the device name does not say)"


def memory_rows(rows: list[dict], batch: int, attention: str, device_bytes: int) -> list[dict]:
    """Measured peak per phase beside the memory model's prediction, and whether the
    predicted step peak fits in `device_bytes`."""
    out = []
    for r in rows:
        pred = predict(get_config(r["model"], attention=attention), batch, r["ctx"], r["dtype"])["peaks"]
        row = {k: r[k] for k in ("model", "ctx", "backend", "dtype", "status", "key")}
        for name in ("forward", "backward", "optimizer", "step"):
            measured_phase = "fused_step" if name == "step" and r["backend"] == "jax" and r["fused_step"] else name
            measured = (r[measured_phase] or {}).get("peak_memory_bytes")
            row[name] = {"measured": measured, "predicted": pred[name],
                         "predicted_over_measured": pred[name] / measured if measured else None}
        row["predicted_fits"] = pred["step"] <= device_bytes
        out.append(row)
    return out


def speedup_rows(rows: list[dict]) -> list[dict]:
    """fp32 median over the other dtype's, per model x ctx x backend and phase."""
    index = {(r["model"], r["ctx"], r["backend"], r["dtype"]): r for r in rows}
    out = []
    for (model, ctx, backend, dtype), r in index.items():
        base = index.get((model, ctx, backend, "fp32"))
        if dtype == "fp32" or base is None:
            continue
        row = {"model": model, "ctx": ctx, "backend": backend, "dtype": dtype, "status": _pair_status(base, r)}
        for name in RUN_PHASES:
            row[name] = base[name]["median_ms"] / r[name]["median_ms"] if base[name] and r[name] else None
        out.append(row)
    return out


def warmup_rows(cells: list[dict]) -> list[dict]:
    """Warm-up study cells: mean, std and first measured step of `step` (and `fused_step`)."""
    rows = []
    for rec in cells:
        c = rec["cell"]
        if c["warmup"] is None:
            continue
        row = {**c, "status": rec["status"], "reason": rec["reason"]}
        for name in ("step", "fused_step"):
            p = _phase(rec, name)
            row[name] = {"mean_ms": p["mean_ms"], "std_ms": p["std_ms"], "first_ms": p["times_ms"][0],
                         "median_ms": p["median_ms"]} if p else None
        rows.append(row)
    return rows


def kernel_rows(cells: list[dict], out_dir: str) -> list[dict]:
    """With --nsys: per cell the top forward kernel and category shares of forward and step,
    from `harness.breakdown`; `error` says why a profile could not be read."""
    from harness.breakdown import breakdown, load_profile
    from harness.nsys import ProfileError

    rows = []
    for rec in cells:
        if not rec.get("profile"):
            continue
        row = {**rec["cell"], "key": rec["key"], "error": None}
        try:
            bd = breakdown(load_profile(os.path.join(out_dir, rec["profile"]), rec["cell"]["backend"]))
        except ProfileError as exc:
            rows.append({**row, "error": str(exc)})
            continue
        for name in ("forward", "step"):
            p = bd.phases.get(name) or (bd.phases.get("fused_step") if name == "step" else None)
            row[name] = None if p is None else {
                "phase": p.phase, "gpu_ms": p.gpu_ns_per_step / 1e6,
                "top_kernel": p.kernels[0].name if p.kernels else None,
                "top_share": p.kernels[0].share if p.kernels else None,
                "categories": {c: ns / p.gpu_ns_per_step for c, ns in p.categories.items()} if p.gpu_ns_per_step else {}}
        rows.append(row)
    return rows


def analyze(out_dir: str, device_memory_gb: float | None = None) -> dict:
    """Everything the report shows, as data."""
    sweep = load_sweep(out_dir)
    cells = sweep_cells(sweep, load_records(out_dir))
    rows = phase_rows(cells)
    device_bytes, device_source = device_memory_bytes(cells, device_memory_gb)
    opts = sweep["options"]
    return {
        "sweep": sweep, "cells": cells, "phases": rows, "ratios": ratio_rows(rows), "bound_notes": bound_notes(rows),
        "memory": memory_rows(rows, opts["batch"], opts["attention"], device_bytes),
        "device_memory": {"bytes": device_bytes, "source": device_source},
        "speedups": speedup_rows(rows), "warmup": warmup_rows(cells),
        "kernels": kernel_rows(cells, out_dir) if opts["nsys"] else [],
        "failed": [c for c in cells if c["status"] in FAILED],
    }


# -- command line ----------------------------------------------------------------------
def comma_list(parse: Callable[[str], object]) -> Callable[[str], list]:
    """An argparse type for "a,b,c", each item checked by `parse` (a harness.cli validator)."""

    def parse_list(value: str) -> list:
        items = [parse(v.strip()) for v in value.split(",") if v.strip()]
        if not items:
            raise UsageError(f"expected a comma-separated list, got {value!r}")
        return list(dict.fromkeys(items))

    return parse_list


def gpu_index(value: str) -> str:
    if not value.isdigit():
        raise UsageError(f"--gpus: expected GPU indices like 0,1,2,3, got {value!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness.sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", type=comma_list(choice("model", list(PRESETS))), help=f"from {', '.join(PRESETS)}")
    p.add_argument("--ctx", type=comma_list(positive_int), help="context lengths, e.g. 128,256,512")
    p.add_argument("--backends", type=comma_list(choice("backend", BACKENDS)), default=list(BACKENDS))
    p.add_argument("--dtype", type=comma_list(choice("dtype", DTYPES)), default=["fp32"], help="e.g. fp32,bf16")
    p.add_argument("--batch", type=positive_int, default=4)
    p.add_argument("--warmup", type=non_negative_int, default=5)
    p.add_argument("--steps", type=positive_int, default=10)
    p.add_argument("--attention", type=choice("attention", ATTENTION_CHOICES), default="naive")
    p.add_argument("--device", type=choice("device", ("cuda", "cpu")), default=None)
    p.add_argument("--mode", type=choice("mode", MODES), default="train")
    p.add_argument("--out", default="results/sweep", help="sweep folder (default results/sweep)")
    p.add_argument("--resume", action="store_true", help="continue the sweep in --out, skipping recorded cells")
    p.add_argument("--cell-timeout", type=positive_int, default=None, metavar="S", help="seconds per cell")
    p.add_argument("--gpus", type=comma_list(gpu_index), default=None, metavar="0,1,...",
                   help="run one cell per listed GPU side by side, each on its own slice of the CPUs")
    p.add_argument("--max-cells", type=positive_int, default=None, metavar="N", help="stop after N cells")
    p.add_argument("--nsys", action="store_true", help="run each cell under nsys profile; report kernel shares")
    p.add_argument("--warmup-study", action="store_true",
                   help=f"also run the first model x ctx x dtype with {', '.join(map(str, WARMUP_STUDY))} warm-up steps")
    p.add_argument("--device-memory-gb", type=float, default=None, metavar="GIB",
                   help="device memory for the fit prediction (default: from the device name, else 80)")
    p.add_argument("--render", metavar="DIR", help="only render the report of the sweep in DIR")
    p.add_argument("--fail-cell", default=None, help=argparse.SUPPRESS)  # "model:ctx:backend:dtype:phase"
    return p


def _check(args: argparse.Namespace) -> None:
    if args.models is None or args.ctx is None:
        raise UsageError("--models and --ctx are required (or --render DIR)")
    if args.attention == "pallas" and "jax" not in args.backends:
        raise UsageError("--attention pallas is a JAX kernel; include jax in --backends")
    if args.fail_cell is not None:
        phase = args.fail_cell.rpartition(":")[2]
        if phase not in ("forward", "backward", "optimizer", "fused_step"):
            raise UsageError(f"--fail-cell {args.fail_cell!r}: end with :forward, :backward, :optimizer or :fused_step")
    if args.nsys:
        from harness.nsys import ProfileError, find_nsys

        try:
            find_nsys()
        except ProfileError as exc:
            raise UsageError(str(exc)) from exc


def render(out_dir: str, device_memory_gb: float | None) -> dict:
    """Analyze the sweep in `out_dir` and write its report there; returns the analysis."""
    from harness.sweep_report import write_report

    data = analyze(out_dir, device_memory_gb)
    print(f"wrote {', '.join(os.path.join(out_dir, f) for f in write_report(data, out_dir))}")
    return data


def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    try:
        if args.render:
            render(args.render, args.device_memory_gb)
            return 0
        _check(args)
        select_platform(args)
        if args.gpus and args.device == "cpu":
            raise UsageError("--gpus runs cells on GPUs; drop it for --device cpu")
        opts = {k: getattr(args, k) for k in FIXED}
        axes = {"models": args.models, "ctx": args.ctx, "backends": args.backends, "dtypes": args.dtype}
        sweep = prepare(args.out, opts, axes, args.resume, args.warmup_study)
    except UsageError as exc:
        return fail(str(exc))
    cells = grid(args.models, args.ctx, args.backends, args.dtype)
    if args.warmup_study:
        cells += grid(args.models[:1], args.ctx[:1], args.backends, args.dtype[:1], warmup_study=True)
    try:
        run_sweep(cells, sweep["options"], args.out, timeout=args.cell_timeout, max_cells=args.max_cells,
                  fail_cell=args.fail_cell, gpus=args.gpus)
    except KeyboardInterrupt:
        print(f"[sweep] interrupted; cells still running were not recorded; continue with --resume --out {args.out}",
              file=sys.stderr)
        return 130
    return 3 if render(args.out, args.device_memory_gb)["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
