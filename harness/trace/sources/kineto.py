"""torch.profiler (Kineto) Chrome traces read into a `Profile`.

What the trace holds (complete events, ``"ph": "X"``):

- GPU activities: category ``kernel``, ``gpu_memcpy`` or ``gpu_memset``; ``pid`` is the
  device, ``tid`` the stream; ``args.correlation`` ties each to the API call that
  launched it. Memcpys and memsets are no kernels and are counted apart.
- Launches: ``cuda_runtime`` / ``cuda_driver`` events on host threads, with the same
  ``args.correlation``. A GPU event whose launch lies before the trace window (or whose
  record Kineto dropped) has none; it is kept and counted, and the profile says how many.
- Ranges: ``user_annotation`` events (``record_function``, ``ProfilerStep#N``) on host threads.
- Synchronization: ``cuda_sync`` events on the GPU rows (``Stream Wait Event`` on the waiting
  stream, ``Event Sync``/``Context Sync`` on none), tied by correlation to the API call that
  asked for them; kept apart (`Profile.syncs`): no GPU work, but HTA's figures count them.

Times: Kineto writes microseconds, with nanoseconds as up to three decimals
(``1712195495519689.047``). A float64 keeps about 16 significant digits, and an epoch time
in µs with three decimals needs 19, so numbers are parsed as `decimal.Decimal` and turned
into integer nanoseconds exactly.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import numpy as np

from harness.common.results import not_a_profile
from harness.trace.analyses.attribution import TID_PROCESS_SHIFT
from harness.trace.profile import (
    KERNEL,
    LAUNCH_APIS,
    MEMCPY,
    MEMSET,
    SYNC,
    UNKNOWN,
    Kernel,
    KernelTable,
    Profile,
    ProfileError,
    Range,
    label_from_path,
)

GPU_KINDS = {"kernel": KERNEL, "gpu_memcpy": MEMCPY, "gpu_memset": MEMSET}
RECORD_KINDS = {**GPU_KINDS, "cuda_sync": SYNC}
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
CPU_NOTE = ("no GPU activity in this trace: CPU {what} stand in for kernels, so times are "
            "host execution times, not GPU times")
UNLAUNCHED_NOTE = ("{n} of {total} GPU activities ({ms:.3f} ms) have no launch call in the trace (launched "
                   "before the trace window opened, or the launch record was dropped): they are kept and counted")


def ns(us: int | Decimal | float) -> int:
    """Integer nanoseconds of a Kineto time in µs (exact for ints and Decimals)."""
    if isinstance(us, int):
        return us * 1000
    return int((Decimal(us) * 1000).to_integral_value())


def read_trace(path: Path) -> dict:
    """The parsed Chrome trace (``.json`` or ``.json.gz``), numbers with decimals as `Decimal`."""
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt") as f:
            trace = json.load(f, parse_float=Decimal)
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise ProfileError(f"{path}: truncated or corrupt gzip ({exc}); copy the trace again") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProfileError(f"{path}: not a torch.profiler Chrome trace ({exc}); write one with "
                           "prof.export_chrome_trace or torch.profiler.tensorboard_trace_handler") from None
    if not isinstance(trace, dict) or "traceEvents" not in trace:
        raise ProfileError(not_a_profile(path, trace)
                           or f"{path}: JSON without traceEvents: not a torch.profiler trace")
    return trace


class _Threads:
    """Host threads numbered as nsys numbers them: process index above `TID_PROCESS_SHIFT`."""

    def __init__(self) -> None:
        self.processes: dict[object, int] = {}
        self.threads: dict[tuple[object, object], int] = {}

    def __call__(self, pid: object, tid: object) -> int:
        key = (pid, tid)
        if key not in self.threads:
            p = self.processes.setdefault(pid, len(self.processes))
            self.threads[key] = (p << TID_PROCESS_SHIFT) | len(self.threads)
        return self.threads[key]


def _gpu_table(gpu: list[dict], launches: dict[int, tuple[int, int, int, int]]) -> KernelTable:
    """The GPU activities as a `KernelTable`, each joined to its launch by correlation id."""
    names = sorted({e["name"] for e in gpu})
    index = {n: i for i, n in enumerate(names)}
    n = len(gpu)
    cols = {c: np.empty(n, np.int64) for c in ("start", "end", "device", "stream", "thread", "launch", "correlation",
                                               "launch_end")}
    name, kind, api = np.empty(n, np.int32), np.empty(n, np.int8), np.empty(n, np.int8)
    for i, e in enumerate(gpu):
        args = e.get("args", {})
        start = ns(e["ts"])
        corr = int(args.get("correlation", UNKNOWN))
        thread, launched, cols["launch_end"][i], api[i] = launches.get(corr, (UNKNOWN,) * 4)
        name[i], kind[i] = index[e["name"]], RECORD_KINDS[e["cat"]]
        cols["start"][i], cols["end"][i] = start, start + ns(e["dur"])
        cols["device"][i] = int(args.get("device", e.get("pid", 0)) or 0)
        stream = args.get("stream", e.get("tid", 0))
        cols["stream"][i] = stream if isinstance(stream, int) else 0
        cols["thread"][i], cols["launch"][i], cols["correlation"][i] = thread, launched, corr
    return KernelTable(names, name, cols["start"], cols["end"], kind, cols["device"], cols["stream"],
                       cols["thread"], cols["launch"], cols["correlation"], launch_end=cols["launch_end"],
                       launch_api=api)


def self_times(ops: list[Kernel]) -> list[Kernel]:
    """CPU ops as kernels that last their self time: each op's duration less that of the
    ops nested directly in it on the same host thread (`Kernel.thread`), as torch.profiler's
    "self CPU" counts it. Each starts where its op starts, so it lies inside the same ranges.
    Self time, not the innermost op: the op that does the work often calls others that do
    none (``aten::mm`` calls ``aten::resolve_conj``), and a caller's whole duration would
    count its callees twice."""
    out = []
    by_thread: dict[int | None, list[Kernel]] = defaultdict(list)
    for k in ops:
        by_thread[k.thread].append(k)
    for thread in by_thread.values():
        thread.sort(key=lambda k: (k.start, -k.end))
        self_ns = [k.duration for k in thread]
        stack: list[int] = []
        for i, k in enumerate(thread):
            while stack and thread[stack[-1]].end <= k.start:
                stack.pop()
            if stack:
                self_ns[stack[-1]] -= k.duration
            stack.append(i)
        out += [Kernel(k.name, k.start, k.start + max(ns, 0), k.device, k.stream, k.thread)
                for k, ns in zip(thread, self_ns)]
    return out


def _cpu_ops(events: list[dict], threads: _Threads) -> list[Kernel]:
    ops = [Kernel(e["name"], ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), 0, 0, threads(e.get("pid"), e.get("tid")))
           for e in events if e.get("cat") == "cpu_op"]
    return self_times(ops)


def load_torch_trace(path: str | Path, label: str | None = None, trace: dict | None = None) -> Profile:
    """Read a torch.profiler Chrome trace (``.json`` or ``.json.gz``) into a `Profile`.

    The program's ``record_function`` ranges and torch.profiler's ``ProfilerStep#N``
    become ranges; those torch opens itself (``Optimizer.step#AdamW.step``, ``nccl:all_reduce``...)
    are library ranges, no phases (`harness.trace.library_ranges`). Without GPU activity,
    torch's ``cpu_op`` events stand in for kernels, each by its self time (`self_times`),
    and the notes say so. `trace`: the file, parsed already (`read_trace`)."""
    path = Path(path)
    trace = trace if trace is not None else read_trace(path)
    events = [e for e in trace["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e]
    threads = _Threads()
    apis = {name: i for i, name in enumerate(LAUNCH_APIS)}
    launches = {int(e["args"]["correlation"]): (threads(e.get("pid"), e.get("tid")), ns(e["ts"]),
                                                ns(e["ts"]) + ns(e["dur"]), apis.get(e["name"], UNKNOWN))
                for e in events if e.get("cat") in LAUNCH_CATEGORIES and "correlation" in e.get("args", {})}
    gpu = [e for e in events if e.get("cat") in GPU_KINDS]
    notes = []
    if gpu:
        kernels = _gpu_table(gpu, launches)
        unlaunched = kernels.launch == UNKNOWN
        if unlaunched.any():
            notes.append(UNLAUNCHED_NOTE.format(n=int(unlaunched.sum()), total=len(kernels),
                                                ms=int(kernels.duration[unlaunched].sum()) / 1e6))
    else:
        kernels = KernelTable.from_kernels(_cpu_ops(events, threads))
        notes.append(CPU_NOTE.format(what="ops (each cpu_op event by its self time)"))
    if not len(kernels):
        raise ProfileError(f"{path}: the trace holds neither GPU kernels nor CPU ops; "
                           "was anything run inside the profiler's block?")
    ranges = [Range(e["name"], ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), threads(e.get("pid"), e.get("tid")))
              for e in events if e.get("cat") == "user_annotation"]
    syncs = [e for e in events if e.get("cat") == "cuda_sync"]
    info = trace.get("distributedInfo") or {}
    devices = {int(d.get("id", -1)): d.get("name") for d in trace.get("deviceProperties") or []}
    used = sorted({devices.get(int(d)) for d in np.unique(kernels.device) if devices.get(int(d))}) if gpu else []
    return Profile(str(path), label or label_from_path(path), "torch.profiler", kernels, ranges, notes,
                   cpu_ops=not gpu, rank=info.get("rank"), world_size=info.get("world_size"),
                   gpu=" + ".join(used) or None, session_start_ns=_base_ns(trace),
                   syncs=_gpu_table(syncs, launches) if syncs else None)


def _base_ns(trace: dict) -> int | None:
    """The wall-clock instant the trace's timestamps count from (Kineto's
    `baseTimeNanoseconds`): the ranks of one host share the clock it is read from."""
    base = trace.get("baseTimeNanoseconds")
    return int(base) if isinstance(base, (int, float)) else None
