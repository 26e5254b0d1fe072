"""Data-parallel runs: N torch processes launched here, or one JAX process over N devices.

torch: the harness is its own `torchrun`. It starts N copies of `harness.runs.rank`
with the env:// rendezvous variables on a free localhost port, one device each (NCCL on
CUDA, gloo on CPU), watches them, and gathers each rank's result document. A rank that
exits with an error or a signal ends the run: the others are stopped (their whole process
groups) and the result names the rank and the cause. JAX: one process runs the same
jitted steps with the batch sharded over a `data` mesh axis (`JaxSession(data_parallel=N)`).

Every process started here inherits this process's environment, with the NVLink-multicast
switches of `SAFE_ENV` added where unset (multicast can take a shared host's GPUs out of
service). Global batch = N x `--batch`: rank r trains on rows [r*batch, (r+1)*batch) of
the token batch a one-device run of `--batch N*batch` trains on, from the same weights.
"""

from __future__ import annotations

import collections
import copy
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

from harness import backends, held_signals
from harness.backends.parallel import SAFE_ENV, apply_safe_env, bucket_mb, parallel_label
from harness.common.documents import RUN_SCHEMA, RunDocument, Status
from harness.common.errors import UsageError

HOST_DEVICES_FLAG = "--xla_force_host_platform_device_count"
GRACE_S = 5.0  # how long a stopped rank gets to exit before SIGKILL
_PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rank_path(path: str, rank: int) -> str:
    """`dir/name.ext` -> `dir/name.rank<r>.ext`: one output file per rank."""
    head, base = os.path.split(path)
    stem, dot, ext = base.partition(".")
    return os.path.join(head, f"{stem}.rank{rank}{dot}{ext}")


def check_devices(backend: str, device: str, n: int) -> None:
    """UsageError unless `n` devices are there for `backend` on `device`: CUDA devices (as
    torch counts them, without creating a context or starting JAX's GPU client, which would
    take memory from the runs), JAX's host devices on CPU (its XLA_FLAGS flag), or for torch
    on CPU one core per gloo process (more ranks than cores would time-share the cores, and
    the step would measure the scheduler)."""
    if n == 1:
        return
    if not backends.get(backend).one_process and device == "cpu":
        cores = len(os.sched_getaffinity(0))
        if cores < n:
            raise UsageError(f"--data-parallel {n}: torch on cpu runs one process per core and this process may "
                             f"use {cores} core(s); use --data-parallel {cores} or fewer")
        return
    if device == "cuda":
        import torch

        have = torch.cuda.device_count()
        if have < n:
            raise UsageError(f"--data-parallel {n}: only {have} CUDA device(s) are visible; use --data-parallel "
                             f"{have} or fewer, or make more visible (CUDA_VISIBLE_DEVICES)")
        return
    found = re.search(rf"{HOST_DEVICES_FLAG}=(\d+)", os.environ.get("XLA_FLAGS", ""))
    have = int(found.group(1)) if found else 1
    if have < n:
        raise UsageError(f"--data-parallel {n}: JAX sees {have} CPU device(s); set "
                         f"XLA_FLAGS={HOST_DEVICES_FLAG}={n} (before the process starts) or lower --data-parallel")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(n: int, rank: int, port: int) -> dict[str, str]:
    """This process's whole environment plus the rendezvous variables of `rank`, with the
    project root first on PYTHONPATH so the workers import this same harness."""
    apply_safe_env()
    path = os.pathsep.join(p for p in (_PROJECT_ROOT, os.environ.get("PYTHONPATH")) if p)
    # As torchrun: one intra-op thread per rank unless set, so N ranks do not oversubscribe the cores.
    threads = os.environ.get("OMP_NUM_THREADS", "1")
    return dict(os.environ, OMP_NUM_THREADS=threads, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                WORLD_SIZE=str(n), RANK=str(rank), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(n), PYTHONPATH=path)


class RankFailure(Exception):
    """A rank ended with an error or a signal; the message names the rank and the cause."""

    def __init__(self, rank: int, message: str, status: str = Status.ERROR.value):
        super().__init__(message)
        self.rank, self.status = rank, status


# A rank's error that reports a peer's failure, not its own.
_PEER_FAILED = re.compile(r"peer|remote worker|connection (?:closed|reset)|communicator was aborted|watchdog"
                          r"|broken pipe", re.IGNORECASE)


def _cause(rank: int, code: int, workdir: str, tail: collections.deque) -> tuple[str, str, int]:
    """(status, message, priority) of a failed rank; lower priority = more likely the root
    cause: a signal, then the rank's own error, then an exit status, then an error that
    says a peer went away."""
    doc_path = os.path.join(workdir, f"rank{rank}.json")
    last = next((line for line in reversed(tail) if line.strip()), "").strip()[:300]
    if code < 0:  # what the rank printed last says why where it could (an abort's reason)
        name = signal.Signals(-code).name
        hint = " (the kernel's out-of-memory killer sends SIGKILL)" if name == "SIGKILL" else ""
        return (Status.ERROR.value, f"rank {rank} was killed by {name}{hint}"
                + (f"; its last output: {last}" if last else ""), 0)
    if os.path.exists(doc_path):
        with open(doc_path) as f:
            doc = json.load(f)
        if not (run := RunDocument.from_dict(doc, doc_path)).ok:
            message = run.message
            return run.status.value, f"rank {rank}: {message}", 3 if _PEER_FAILED.search(message) else 1
    return (Status.ERROR.value, f"rank {rank} exited with code {code}: {last or 'no output'}",
            3 if _PEER_FAILED.search(last) else 2)


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each live rank's process group, then SIGKILL what is left after GRACE_S."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        live = [p for p in procs if p.poll() is None]
        for p in live:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + GRACE_S
        while any(p.poll() is None for p in live) and time.monotonic() < deadline:
            time.sleep(0.05)
    for p in procs:
        p.wait()


def launch(options: dict, job: str, workdir: str, n: int, progress: bool = True,
           wrap: Callable[[int, list[str]], list[str]] | None = None) -> None:
    """Run `n` ranks of `harness.runs.rank` on `job` ("run" or "parity") with `options`
    (RunSpec as a dict) in `workdir`; return when all exited 0, else raise RankFailure
    after stopping the others. Rank 0's progress lines pass through when `progress`.
    `wrap(rank, argv)`: the command that runs a rank's argv (a profiler around it)."""
    spec = os.path.join(workdir, "spec.json")
    with open(spec, "w") as f:
        json.dump({"options": options, "job": job, "quiet": not progress}, f)
    port = free_port()
    procs: list[subprocess.Popen] = []
    tails = [collections.deque(maxlen=20) for _ in range(n)]

    def pump(rank: int, stream) -> None:
        for line in stream:
            tails[rank].append(line.rstrip())
            if rank == 0 and progress:
                sys.stderr.write(line)

    try:
        for rank in range(n):
            argv = [sys.executable, "-m", "harness.runs.rank", spec, str(rank)]
            with held_signals():  # a signal inside Popen would leave a started rank out of `procs`, running on
                procs.append(subprocess.Popen(wrap(rank, argv) if wrap else argv, env=worker_env(n, rank, port),
                                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                              start_new_session=True))
        readers = [threading.Thread(target=pump, args=(r, p.stderr), daemon=True) for r, p in enumerate(procs)]
        for t in readers:
            t.start()
        while any(p.poll() is None for p in procs) and not any(p.returncode for p in procs):
            time.sleep(0.05)
        failed_at = time.monotonic()
        # Let the ranks that fail because a peer died exit too, so the root cause is chosen among all.
        while any(p.poll() is None for p in procs) and time.monotonic() - failed_at < 1.0 \
                and any(p.returncode for p in procs):
            time.sleep(0.05)
    finally:
        stopped = {r for r, p in enumerate(procs) if p.poll() is None}  # alive at the end: the launcher's doing
        _stop(procs)
    for t in readers:
        t.join(timeout=GRACE_S)
    failures = [(*_cause(r, p.returncode, workdir, tails[r]), r) for r, p in enumerate(procs)
                if p.returncode and r not in stopped]
    if failures:
        status, message, _, rank = min(failures, key=lambda f: (f[2], f[3]))
        after = [f"rank {r} failed after it" for *_, r in failures if r != rank]
        after += [f"rank {r} was stopped" for r in sorted(stopped)]
        if after:
            message += f" ({'; '.join(after)})"
        raise RankFailure(rank, message, status)


def data_parallel_record(per_rank: list[dict], opts, note: str) -> dict:
    """Per-rank medians of every phase, their spread (straggler = slowest over fastest
    rank's median) and the step: the slowest rank's median `step`, which sets the pace
    of a synchronous data-parallel step, with tokens/s over the global batch."""
    n, phases = opts.data_parallel, per_rank[0].keys()
    spread = {}
    for name in phases:
        medians = [r[name] for r in per_rank]
        slow = max(range(len(medians)), key=medians.__getitem__)
        spread[name] = {"min_ms": min(medians), "max_ms": medians[slow], "slowest_rank": slow,
                        "straggler": medians[slow] / min(medians) if min(medians) else None}
    step_ms = spread["step"]["max_ms"]
    tokens = n * opts.batch * opts.ctx
    record = backends.get(opts.backend)
    ddp = opts.parallel == "ddp" and record.wrap_options
    return {"n": n, "parallel": opts.parallel, "label": parallel_label(opts.backend, opts.parallel),
            "bucket_mb": bucket_mb(opts) if ddp else None,
            "per_device_batch": opts.batch, "global_batch": n * opts.batch,
            "ranks": [{"rank": r, "median_ms": m} for r, m in enumerate(per_rank)], "spread": spread,
            "step_ms": step_ms, "tokens_per_s": tokens / (step_ms / 1e3) if step_ms else None,
            "environment": {k: os.environ.get(k) for k in SAFE_ENV}, "note": note}


def host_split(doc: dict) -> dict | None:
    """Waiting and transfer of a torch data-parallel run from the ranks' own host timings
    (`harness.trace.analyses.collectives`): each rank's backward, which holds DDP's gradient
    all-reduce, aligned across ranks on the host clock they share; the rank that reached
    it last and the phase that made it late. None without the timings, and under FSDP2:
    its all-gathers and reduce-scatters run inside the forward and the backward, so a rank
    that waits inside a phase cannot be told from one that computes there (its split needs
    each rank's kernels, `--nsys`)."""
    from harness.trace.analyses.collectives import align, range_ops
    from harness.trace.profile import Range

    ranks = doc.get("ranks") or []
    if (doc.get("options") or {}).get("parallel", "ddp") != "ddp":
        return None
    if len(ranks) < 2 or not all(r.get("intervals_ns") for r in ranks):
        return None
    ranges = {r["rank"]: sorted((Range(name, a, b) for name, spans in r["intervals_ns"].items() for a, b in spans),
                                key=lambda x: x.start) for r in ranks}
    steps = len(ranks[0]["intervals_ns"].get("step", []))
    split = align({r: range_ops(rs) for r, rs in ranges.items()}, ranges, steps=steps)
    split["method"] = ("host timings: each rank's backward (holding the gradient all-reduce) aligned across ranks; "
                       "the part before the last rank's backward starts is waiting")
    return split


def _medians(doc: dict) -> dict:
    return {name: p["median_ms"] for name, p in doc["phases"].items()}


def _failed_doc(opts, exc: RankFailure) -> dict:
    import dataclasses

    from harness.common.results import environment

    options = dataclasses.asdict(opts)
    options.pop("fail_in")
    return {"schema": RUN_SCHEMA, "status": exc.status, "error": {"phase": f"rank {exc.rank}", "message": str(exc)},
            "options": options, "warnings": [], "env": environment()}


def nsys_per_rank(backend: str, stem: str, nsys_bin: str | None) -> Callable[[int, list[str]], list[str]]:
    """A `launch` wrap that runs rank r under `nsys profile`, writing `stem.rank<r>.nsys-rep`."""
    from harness.trace.sources.nsys import profile_command

    flags = backends.get(backend).nsys_flags
    return lambda rank, argv: profile_command(rank_path(stem, rank), argv, nsys_bin, flags)


def run_data_parallel(opts, progress: Callable[[str], None] = lambda m: None, quiet: bool = False,
                      wrap: Callable[[int, list[str]], list[str]] | None = None) -> dict:
    """The result document of a data-parallel run (`opts.data_parallel` devices): rank 0's
    document with `data_parallel` (per-rank medians, spread, global step figures) and
    `ranks` (every rank's phases), or a failed document naming the rank that ended it.
    `wrap`: see `launch` (torch only; JAX runs in this process)."""
    import dataclasses

    from harness.timing.runner import run

    apply_safe_env()
    if backends.get(opts.backend).one_process:
        doc = run(opts, progress)
        if RunDocument.from_dict(doc).ok:
            doc["data_parallel"] = data_parallel_record(
                [_medians(doc)], opts, "one process drives every device: one timeline, no per-device spread")
        return doc
    with tempfile.TemporaryDirectory(prefix="dp-") as work:
        try:
            launch(dataclasses.asdict(opts), "run", work, opts.data_parallel, progress=not quiet, wrap=wrap)
        except RankFailure as exc:
            return _failed_doc(opts, exc)
        docs = []
        for r in range(opts.data_parallel):
            with open(os.path.join(work, f"rank{r}.json")) as f:
                docs.append(json.load(f))
    merged = copy.deepcopy(docs[0])
    merged["data_parallel"] = data_parallel_record(
        [_medians(d) for d in docs], opts, "one process per device; each rank's phases timed by its own timer")
    merged["data_parallel"]["environment"] = docs[0]["environment_seen"]
    merged["ranks"] = [{"rank": d["rank"], "phases": d["phases"], "loss": d["loss"],
                        "intervals_ns": d.get("intervals_ns"), "overhead": d.get("overhead"),
                        "gpu_clocks": d.get("gpu_clocks")} for d in docs]
    merged["data_parallel"]["link"] = docs[0].get("link")
    merged["data_parallel"]["host_split"] = host_split(merged)
    return merged


def parity_step(opts) -> tuple[float, dict]:
    """(loss over the global batch, full parameters) after one optimizer step on
    `opts.data_parallel` devices: N torch ranks, or JAX over N devices in this process."""
    import dataclasses

    import numpy as np

    if backends.get(opts.backend).one_process:
        from harness.config import get_config
        from harness.timing.runner import make_session

        session = make_session(opts, get_config(opts.model, attention=opts.attention))
        loss = session.forward()
        session.backward()
        session.optimizer_step()
        return float(loss), session.params()
    with tempfile.TemporaryDirectory(prefix="dp-parity-") as work:
        launch(dataclasses.asdict(opts), "parity", work, opts.data_parallel, progress=False)
        with np.load(os.path.join(work, "parity.npz")) as data:
            params = {k: data[k] for k in data.files if k != "__loss__"}
            return float(data["__loss__"]), params
