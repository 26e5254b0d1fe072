"""The profile data model every trace source converts to, and the range names the harness emits.

A `Profile` is the kernels and annotation ranges of one profiled run, whichever tool
recorded it (nsys, torch.profiler, jax.profiler); `harness.trace.analyses.breakdown` analyses it.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from harness.backends import names as backend_names

# Range names the harness emits (NVTX, record_function or TraceAnnotation).
WARMUP = "warmup"
PROFILER_STEP = "ProfilerStep"  # torch.profiler's own step ranges, ProfilerStep#N
STEP_RANGES = ("step", "fused_step", PROFILER_STEP)
PHASES = ("forward", "backward", "optimizer")
ATTENTION_RANGES = ("attn_scores", "attn_softmax", "attn_values")
HARNESS_RANGES = (WARMUP, *STEP_RANGES, *PHASES, *ATTENTION_RANGES)


class ProfileError(Exception):
    """A profile that cannot be analysed; the message names the likely cause and the fix."""


@dataclass(frozen=True)
class Kernel:
    """One GPU activity (kernel, memcpy or memset), or a CPU op when no GPU was traced."""

    name: str  # demangled name where the source has one
    start: int  # ns, same clock as the ranges
    end: int
    device: int = 0
    stream: int = 0
    thread: int | None = None  # the launching thread, where known

    @property
    def duration(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Range:
    """One annotation range (NVTX, record_function or TraceAnnotation)."""

    name: str
    start: int  # ns
    end: int
    thread: int | None = None
    number: int | None = None  # the instance number a numbered name carried (`step7` -> `step`, 7)


# KernelTable.kind: what a GPU activity is (memcpys and memsets are not kernels); SYNC: a
# synchronization record on a GPU row (`Profile.syncs` only: no work of the GPU's)
KERNEL, MEMCPY, MEMSET, GRAPH, SYNC = 0, 1, 2, 3, 4
UNKNOWN = -1  # thread, launch time or correlation id that the source does not record
# The API calls that put work on a stream asynchronously (HTA's launch and queue analyses count
# these), CUDA's and then ROCm's (HIP's, as torch.profiler records them on AMD GPUs)
LAUNCH_APIS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cudaMemcpyAsync", "cudaMemsetAsync",
               "hipLaunchKernel", "hipExtModuleLaunchKernel", "hipMemcpyAsync", "hipMemsetAsync", "hipMemcpyWithStream")
PROCESS_SHIFT = 24  # a thread id holds its process above bit 24 (nsys's globalTid; Kineto's as read)


@dataclass
class KernelTable:
    """Every GPU activity of a profile as columns (one NumPy array each), sorted by start.

    A profile can hold hundreds of thousands of kernels: columns keep it to a few dozen
    bytes per kernel and let the analysis join kernels to ranges with sorted-array
    searches instead of a Python object and loop per kernel. Names are stored once, in
    `names`; `name` holds each kernel's index into it."""

    names: list[str]
    name: np.ndarray  # int32 index into `names`
    start: np.ndarray  # int64 ns, same clock as the ranges
    end: np.ndarray
    kind: np.ndarray  # int8: KERNEL, MEMCPY, MEMSET or GRAPH
    device: np.ndarray  # int64
    stream: np.ndarray
    thread: np.ndarray  # the launching thread, UNKNOWN where not recorded
    launch: np.ndarray  # start of the launching API call (ns), UNKNOWN where not recorded
    correlation: np.ndarray  # CUPTI correlation id, UNKNOWN where not recorded
    process: np.ndarray | None = None  # the launching process (nsys: globalPid >> 24); default: the thread's
    launch_end: np.ndarray | None = None  # end of the launching API call (ns), UNKNOWN where not recorded
    launch_api: np.ndarray | None = None  # int8 index into LAUNCH_APIS, UNKNOWN: another call or not recorded

    def __post_init__(self) -> None:
        if self.process is None:
            self.process = np.where(self.thread != UNKNOWN, self.thread >> PROCESS_SHIFT, UNKNOWN)
        for col, dtype in (("launch_end", np.int64), ("launch_api", np.int8)):
            if getattr(self, col) is None:
                setattr(self, col, np.full(len(self.start), UNKNOWN, dtype))
        order = np.argsort(self.start, kind="stable")
        if not np.all(order[:-1] < order[1:]):
            for col in _COLUMNS:
                setattr(self, col, getattr(self, col)[order])

    def __len__(self) -> int:
        return len(self.start)

    @property
    def duration(self) -> np.ndarray:
        return self.end - self.start

    def name_of(self, i: int) -> str:
        return self.names[int(self.name[i])]

    def take(self, mask: np.ndarray) -> KernelTable:
        """The rows of `mask` (still sorted by start), sharing `names`."""
        return KernelTable(self.names, *(getattr(self, col)[mask] for col in _COLUMNS))

    @classmethod
    def from_kernels(cls, kernels: Sequence[Kernel]) -> KernelTable:
        """The table of `kernels` (a small profile or a test's hand-made one)."""
        names = sorted({k.name for k in kernels})
        index = {n: i for i, n in enumerate(names)}
        col = lambda f, dtype=np.int64: np.array([f(k) for k in kernels], dtype=dtype)  # noqa: E731
        kinds = {"[CUDA memcpy]": MEMCPY, "[CUDA memset]": MEMSET}
        return cls(names, col(lambda k: index[k.name], np.int32), col(lambda k: k.start), col(lambda k: k.end),
                   col(lambda k: kinds.get(k.name, KERNEL), np.int8), col(lambda k: k.device),
                   col(lambda k: k.stream), col(lambda k: UNKNOWN if k.thread is None else k.thread),
                   np.full(len(kernels), UNKNOWN, np.int64), np.full(len(kernels), UNKNOWN, np.int64))


_COLUMNS = ("name", "start", "end", "kind", "device", "stream", "thread", "launch", "correlation", "process",
            "launch_end", "launch_api")


@dataclass(frozen=True)
class ApiStat:
    """One CUDA runtime/driver API function over the whole profile."""

    name: str
    group: str  # "launch", "synchronization", "graph", "memcpy", "memset", "allocation" or "other"
    count: int
    total_ns: int

    @property
    def mean_ns(self) -> float:
        return self.total_ns / self.count if self.count else 0.0


@dataclass
class Profile:
    """Kernels and ranges of one profiled run, whatever tool recorded them.

    `kernels` may be given as a list of `Kernel`; it is stored as a `KernelTable`."""

    path: str
    label: str
    source: str  # "nsys", "torch.profiler" or "jax.profiler"
    kernels: KernelTable
    ranges: list[Range]
    notes: list[str] = field(default_factory=list)  # caveats the report repeats
    api: list[ApiStat] = field(default_factory=list)  # CUDA API calls, where the source records them
    cpu_ops: bool = False  # no GPU activity was traced: CPU ops stand in for kernels
    rank: int | None = None  # the process's rank where the profile records it (Kineto's distributedInfo)
    world_size: int | None = None
    gpu: str | None = None  # the GPU's name where recorded
    # Where the timestamps count from (UTC ns): nsys's session start, torch.profiler's
    # baseTimeNanoseconds. Profiles of several processes on one host share one clock once
    # each is shifted by its own start.
    session_start_ns: int | None = None
    # Kineto's cuda_sync records on the GPU rows (Stream Wait Event, Stream Sync, Event Sync,
    # Context Sync), where recorded: no work, left out of every figure but HTA's (`gpu_time`)
    syncs: KernelTable | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kernels, KernelTable):
            self.kernels = KernelTable.from_kernels(list(self.kernels))
        self.ranges = sorted(self.ranges, key=lambda r: (r.start, -r.end))
        self._check_durations()

    def _check_durations(self) -> None:
        """A ProfileError naming the records that end before they start: no analysis can
        place a negative duration (it would subtract time), and it is the profile's own fault,
        not a matter of clocks."""
        kt = self.kernels
        bad = np.flatnonzero(kt.end < kt.start)
        what = "CPU ops" if self.cpu_ops else "GPU activities"
        if len(bad):
            first = int(bad[0])
            raise ProfileError(f"{self.path}: {len(bad)} of {len(kt)} {what} end before they start (negative "
                               f"durations; the first: {kt.name_of(first)!r}, {int(kt.duration[first])} ns): the "
                               "profiler wrote damaged records; record the profile again")
        ranges = [r for r in self.ranges if r.end < r.start]
        if ranges:
            raise ProfileError(f"{self.path}: {len(ranges)} of {len(self.ranges)} ranges end before they start "
                               f"(negative durations; the first: {ranges[0].name!r}, {ranges[0].end - ranges[0].start}"
                               " ns): the profiler wrote damaged records; record the profile again")


PROFILE_SUFFIXES = re.compile(r"(?:\.pt)?(?:\.trace)?\.(?:json|sqlite|xplane\.pb|nsys-rep)(?:\.gz)?$")


def label_from_path(path: str | Path) -> str:
    """The registered backend (`harness.backends`) named in the file name, else the name
    without its profile suffixes (`x.rank0.json.gz` -> `x.rank0`: ranks of one job stay apart).

    A name inside a longer registered name found at the same place is that name's
    (`torch-compile.sqlite` is torch-compile's, not torch's); two backends named: neither."""
    name = Path(path).name.lower()
    spans = [(m.start(), m.start() + len(b), b) for b in backend_names()
             for m in re.finditer(re.escape(b.lower()), name)]
    found = {b for s, e, b in spans if not any(s2 <= s and e <= e2 and (s2, e2) != (s, e) for s2, e2, _ in spans)}
    return found.pop() if len(found) == 1 else PROFILE_SUFFIXES.sub("", Path(path).name)


# A name ending in a number: `step0`, `step 12`, `iteration_3`, `train_step[7]`, `ProfilerStep#5`.
NUMBERED = re.compile(r"^(?P<base>.*?[A-Za-z])(?:\s+|[_#-]|\[)?(?P<number>\d+)\]?$")


def numbered_instances(ranges: Sequence[Range]) -> tuple[list[Range], str]:
    """Ranges whose names differ only by a number, as instances of one range.

    A program that names each step after its index (``step0`` ... ``step7``) means one
    range repeated: each becomes `base` with its `number`. A base is merged only where at
    least two distinct numbers carry it, so a lone ``fp8`` keeps its name. Returns the
    ranges and the rule applied, in words ("" where none applied)."""
    numbers: dict[str, set[int]] = defaultdict(set)
    for r in ranges:
        if m := NUMBERED.match(r.name):
            numbers[m["base"]].add(int(m["number"]))
    bases = {b for b, n in numbers.items() if len(n) >= 2}
    if not bases:
        return list(ranges), ""
    out = []
    for r in ranges:
        m = NUMBERED.match(r.name)
        out.append(replace(r, name=m["base"], number=int(m["number"])) if m and m["base"] in bases else r)
    listed = ", ".join(f"`{b}` ({len(numbers[b])} numbers, {min(numbers[b])} to {max(numbers[b])})"
                       for b in sorted(bases))
    return out, f"ranges named with a number are instances of one range: {listed}"


def open_profiler_step(ranges: Sequence[Range], kernels: KernelTable | None = None) -> tuple[list[Range], str]:
    """The ranges without a last ``ProfilerStep`` that torch.profiler closed mid-iteration.

    ``prof.stop()`` (or the end of the loop) closes the step it is in: where the last
    ``ProfilerStep`` holds none of the ranges the earlier ones hold, it is no step of the
    program's and would halve the per-step figures; its kernels count as outside every
    step. Where no step holds a range (a loop with no `record_function`), the same holds of
    a last step in which no GPU activity of `kernels` was launched or began while one was
    in an earlier step: set apart the first step as the warm-up, an empty one would be left
    as the only step measured. Returns the ranges and the rule applied ("" where none)."""
    steps = [r for r in ranges if r.name == PROFILER_STEP]
    if len(steps) < 2:
        return list(ranges), ""

    def holds(step: Range) -> bool:
        return any(r is not step and step.start <= r.start and r.end <= step.end for r in ranges)

    def runs(step: Range) -> bool:
        inside = lambda t: (step.start <= t) & (t <= step.end)  # noqa: E731
        return kernels is not None and bool(np.any(inside(kernels.launch) | inside(kernels.start)))

    last = max(steps, key=lambda r: r.start)
    number = f" #{last.number}" if last.number is not None else ""
    earlier = [r for r in steps if r is not last]
    if not holds(last) and any(holds(r) for r in earlier):
        return [r for r in ranges if r is not last], (f"the last `{PROFILER_STEP}`{number} holds none of the phases "
                                                      "the others hold (closed by prof.stop()): left out")
    if not any(map(holds, steps)) and not runs(last) and any(map(runs, earlier)):
        return [r for r in ranges if r is not last], (f"the last `{PROFILER_STEP}`{number} holds no GPU work, the "
                                                      "others do (closed by prof.stop()): left out")
    return list(ranges), ""
