"""The profile data model every trace source converts to, and the range names the harness emits.

A `Profile` is the kernels and annotation ranges of one profiled run, whichever tool
recorded it (nsys, torch.profiler, jax.profiler); `harness.trace.analyses.breakdown` analyses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

BACKENDS = ("torch", "jax")
# Range names the harness emits (NVTX, record_function or TraceAnnotation).
WARMUP = "warmup"
STEP_RANGES = ("step", "fused_step")
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


# KernelTable.kind: what a GPU activity is (memcpys and memsets are not kernels)
KERNEL, MEMCPY, MEMSET, GRAPH = 0, 1, 2, 3
UNKNOWN = -1  # thread, launch time or correlation id that the source does not record


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

    def __post_init__(self) -> None:
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


_COLUMNS = ("name", "start", "end", "kind", "device", "stream", "thread", "launch", "correlation")


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
    device: str | None = None  # the GPU's name, where the source records it (nsys) and it is one GPU

    def __post_init__(self) -> None:
        if not isinstance(self.kernels, KernelTable):
            self.kernels = KernelTable.from_kernels(list(self.kernels))
        self.ranges = sorted(self.ranges, key=lambda r: (r.start, -r.end))


def label_from_path(path: str | Path) -> str:
    """The backend named in the file name ("torch", "jax"), else the file's stem."""
    name = Path(path).name.lower()
    found = [b for b in BACKENDS if b in name]
    return found[0] if len(found) == 1 else Path(path).name.split(".")[0]
