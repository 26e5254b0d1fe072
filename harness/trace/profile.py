"""The profile data model every trace source converts to, and the range names the harness emits.

A `Profile` is the kernels and annotation ranges of one profiled run, whichever tool
recorded it (nsys, torch.profiler, jax.profiler); `harness.trace.breakdown` analyses it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

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


@dataclass
class Profile:
    """Kernels and ranges of one profiled run, whatever tool recorded them."""

    path: str
    label: str
    source: str  # "nsys", "torch.profiler" or "jax.profiler"
    kernels: list[Kernel]
    ranges: list[Range]
    notes: list[str] = field(default_factory=list)  # caveats the report repeats


def label_from_path(path: str | Path) -> str:
    """The backend named in the file name ("torch", "jax"), else the file's stem."""
    name = Path(path).name.lower()
    found = [b for b in BACKENDS if b in name]
    return found[0] if len(found) == 1 else Path(path).name.split(".")[0]
