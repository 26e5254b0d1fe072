"""Running a sweep's cells: one `harness.run` subprocess per cell, one at a time or one per GPU.

A cell that runs out of memory, crashes, dies by a signal or passes its timeout is
recorded with its reason (`harness.sweeps.records`) and the sweep goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from harness import backends, held_signals
from harness.common.documents import RunDocument, Status
from harness.config import get_config
from harness.runs.distributed import GRACE_S
from harness.sweeps.records import FIXED_DEFAULTS, Cell, append_record, cell_record, load_records
from harness.timing.spec import RunSpec, run_argv


# -- running one cell ------------------------------------------------------------------
def cell_spec(cell: Cell, opts: dict, fail_in: str | None = None) -> RunSpec:
    """The run of one cell: the sweep's options `opts` at the cell's point of the grid (a
    sweep written before an option existed runs with its default)."""
    fixed = {**FIXED_DEFAULTS, **opts}
    spec = RunSpec(backend=cell.backend, model=cell.model, ctx=cell.ctx, batch=cell.batch or opts["batch"],
                   dtype=cell.dtype, attention=opts["attention"], device=opts["device"], mode=opts["mode"],
                   warmup=opts["warmup"] if cell.warmup is None else cell.warmup, steps=opts["steps"],
                   optimizer=opts["optimizer"], data_parallel=cell.data_parallel or 1,
                   parallel=fixed["parallel"], ddp_bucket_mb=fixed["ddp_bucket_mb"],
                   ddp_static_graph=fixed["ddp_static_graph"], grad_comm=fixed["grad_comm"],
                   fsdp_reshard_after_forward=fixed["fsdp_reshard_after_forward"] in (True, "true"))
    return spec.on(cell.backend, fail_in)


def cell_command(cell: Cell, opts: dict, out_json: str, fail_in: str | None = None) -> list[str]:
    """The `harness.run` argv of one cell; a cell that runs out of memory is a finding of the
    sweep, so it runs where the memory model predicts no fit too (`--allow-oom`)."""
    python, m, module, *options = run_argv(cell_spec(cell, opts, fail_in), out_json)
    return [python, m, module, "--allow-oom", *options]


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
        """Stop the cell (`stop_cells`)."""
        stop_cells([self])


# How long a stopped cell gets to exit after SIGTERM before SIGKILL: a data-parallel run's
# launcher first stops its ranks, each in a session of its own, which it gives GRACE_S.
STOP_GRACE_S = GRACE_S + 5


def stop_cells(jobs: list[CellProcess]) -> None:
    """SIGTERM each cell's process group (its harness.run stops what it started, as on
    Ctrl-C: a data-parallel launcher its ranks, which SIGKILL of the group would not reach),
    then SIGKILL what is left after STOP_GRACE_S."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        live = [job for job in jobs if job.proc.poll() is None]
        for job in live:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.proc.pid, sig)
        deadline = time.monotonic() + STOP_GRACE_S
        while any(job.proc.poll() is None for job in live) and time.monotonic() < deadline:
            time.sleep(0.05)
    for job in jobs:
        job.proc.wait()
        job._log.close()


def outcome(doc: dict | None, code: int | None, timed_out: bool, timeout: float | None,
            log_path: str) -> tuple[Status, str | None]:
    """(status, reason) of a finished cell: the run's own verdict if it wrote one, else why not."""
    if doc is not None:
        run = RunDocument.from_dict(doc, f"the run document of the cell logged in {log_path}")
        return run.status, run.error.message if run.error else None
    if timed_out:
        return Status.TIMEOUT, f"no result within --cell-timeout {timeout:g} s (killed)"
    if code is not None and code < 0:
        return Status.CRASHED, f"killed by signal {signal.Signals(-code).name}, no result; log: {_tail(log_path)}"
    return Status.CRASHED, f"exit code {code}, no result; log: {_tail(log_path)}"


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
    nsys_bin: str | None = None


def start_cell(cell: Cell, opts: dict, out_dir: str, *, timeout: float | None = None, fail_in: str | None = None,
               gpu: str | None = None, cpus: set[int] | None = None, nsys_bin: str | None = None) -> StartedCell:
    """Start one cell's subprocess (under nsys `nsys_bin` when opts["nsys"]), on GPU `gpu` if given."""
    name = cell.key.replace(":", "_")
    for sub in ("runs", "logs"):
        os.makedirs(os.path.join(out_dir, sub), exist_ok=True)
    out_json, log = os.path.join("runs", f"{name}.json"), os.path.join("logs", f"{name}.log")
    cmd = cell_command(cell, opts, os.path.join(out_dir, out_json), fail_in)
    report = os.path.join(out_dir, "runs", name) if opts["nsys"] else None
    if report:
        from harness.trace.sources.nsys import profile_command

        cmd = profile_command(report, cmd, nsys_bin, backends.get(cell.backend).nsys_flags)
    if os.path.exists(os.path.join(out_dir, out_json)):
        os.remove(os.path.join(out_dir, out_json))  # left by an interrupted attempt
    env = None if gpu is None else {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
    job = CellProcess(cmd, os.path.join(out_dir, log), timeout, env=env, cpus=cpus)
    return StartedCell(cell, job, out_dir, out_json, log, report, gpu, timeout, nsys_bin)


def finish_cell(started: StartedCell, code: int | None, timed_out: bool) -> dict:
    """The record of a cell whose process has ended."""
    s = started
    wall = time.monotonic() - s.job.started
    doc = None
    if os.path.exists(os.path.join(s.out_dir, s.out_json)):
        with open(os.path.join(s.out_dir, s.out_json)) as f:
            doc = json.load(f)
    status, reason = outcome(doc, code, timed_out, s.timeout, os.path.join(s.out_dir, s.log))
    profile = _export_profile(s.report, s.nsys_bin) if s.report and os.path.exists(f"{s.report}.nsys-rep") else None
    return cell_record(s.cell, status, reason, doc, exit_code=code, wall_s=wall, log=s.log, gpu=s.gpu,
                       profile=os.path.relpath(profile, s.out_dir) if profile else None)


def run_cell(cell: Cell, opts: dict, out_dir: str, *, timeout: float | None = None,
             fail_in: str | None = None) -> dict:
    """Run one cell to its end and return its record; stopped (Ctrl-C, a stop signal), the
    cell's process group is stopped too, even when the signal came as it started."""
    started = None
    try:
        with held_signals():  # a signal inside Popen would leave the started cell unseen, running on
            started = start_cell(cell, opts, out_dir, timeout=timeout, fail_in=fail_in)
        return finish_cell(started, *started.job.wait())
    except BaseException:
        if started is not None:
            started.job.kill()
        raise


def _export_profile(report: str, nsys_bin: str | None) -> str | None:
    from harness.trace.profile import ProfileError
    from harness.trace.sources.nsys import export_sqlite

    try:
        return str(export_sqlite(f"{report}.nsys-rep", nsys_bin))
    except ProfileError as exc:
        print(f"[sweep] {exc}", file=sys.stderr)
        return None


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


def longest_first(cells: list[Cell], base_batch: int = 1) -> list[Cell]:
    """Cells ordered by a rough cost (step FLOPs, JAX's compilation counted as a multiple),
    so that side-by-side cells end together instead of one GPU finishing a big cell alone;
    `base_batch` is the batch of cells that carry none."""
    from harness.timing.flops import forward_flops

    def cost(cell: Cell) -> float:
        flops = forward_flops(get_config(cell.model), cell.batch or base_batch, cell.ctx)
        return flops * backends.get(cell.backend).compile_weight

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
              nsys_bin: str | None = None, log: Callable[[str], None] = lambda m: print(m, file=sys.stderr,
                                                                                        flush=True)) -> None:
    """Run the cells not yet recorded in `out_dir`, appending each record as it finishes.

    `gpus` runs one cell per listed GPU side by side (CUDA_VISIBLE_DEVICES), each pinned to
    its own equal slice of the CPUs so a launch-bound eager run does not compete with a
    compiling one, longest cells first; without it, cells run one at a time in grid order
    on the default device. `max_cells` stops after that many cells (resume later);
    `fail_cell` "KEY:PHASE" makes that cell simulate an out-of-memory in PHASE
    (harness.run --fail-in); `nsys_bin` is the nsys binary of --nsys sweeps."""
    recorded = {r["key"] for r in load_records(out_dir)}
    pending = [c for c in cells if c.key not in recorded]
    done = len(cells) - len(pending)
    if done:
        log(f"[sweep] {done} of {len(cells)} cells already recorded in {out_dir}; skipping them")
    todo = pending[:max_cells] if max_cells is not None else pending
    fail_key, _, fail_phase = (fail_cell or "").rpartition(":")
    if gpus and len(gpus) > 1:
        todo = longest_first(todo, opts["batch"])
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
                with held_signals():  # started and held in `running` at once, so a stop reaches it
                    running[gpu] = start_cell(cell, opts, out_dir, timeout=timeout, gpu=gpu, cpus=cpus[gpu],
                                              nsys_bin=nsys_bin,
                                              fail_in=fail_phase if cell.key == fail_key else None)
                where = f" on GPU {gpu}" if gpu is not None else ""
                names = [s.cell.key for s in running.values()]
                left = len(pending) - finished - len(running)
                status = progress_line(done + finished, names, left, walls, len(slots))
                log(f"[sweep] started {cell.key}{where}; {status}")
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
        stop_cells([started.job for started in running.values()])
        raise
    left = len(pending) - len(todo)
    log(f"[sweep] stopped after {len(todo)} cells (--max-cells); "
        f"{progress_line(done + len(todo), [], left, walls, len(slots))}; continue with --resume"
        if left else f"[sweep] all {len(cells)} cells recorded")
