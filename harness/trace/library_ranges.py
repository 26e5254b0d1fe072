"""Library ranges: the annotation ranges frameworks and libraries open themselves, as data.

A program's own ranges (``record_function``, NVTX, ``TraceAnnotation``) name its steps and
phases. Frameworks open ranges of their own inside them: FSDP2 around every all-gather and
reshard (``FSDP::all_gather (blocks.0)``), DDP around its reducer, c10d around every
collective (``nccl:all_reduce``), torch.optim around each step (``Optimizer.step#AdamW.step``),
torch.compile around its compiled regions, XLA around its modules. They are no phases and no
steps: their kernels count in the program's phase that holds them, and the breakdown lists
them per phase, as sub-ranges (`harness.trace.analyses.library`).

`LIBRARY_RANGES` is an ordered tuple of ``(library, regex)`` pairs; the first regex that
matches a range's name (from its start) names its library. torch.profiler's
``ProfilerStep#N`` is a step, unless it lies inside a range of the program's own, which is
then the step (`harness.trace.analyses.selection.program_ranges` decides that by position).
`group_name` folds the names that differ only by a module index (``FSDP::all_gather
(blocks.0)`` ... ``(blocks.5)``: ``FSDP::all_gather (blocks.*)``) into one row of the report.
"""

from __future__ import annotations

import re

LIBRARY_RANGES: tuple[tuple[str, str], ...] = (
    ("FSDP", r"FSDP::"),
    ("DDP", r"DDP::|DistributedDataParallel\."),
    ("NCCL", r"nccl:|nccl[A-Z]\w*$|c10d::"),
    ("torch.optim", r"Optimizer\.\w+#"),
    ("autograd", r"autograd::"),
    ("torch.compile", r"CompiledFunction(?:Backward)?$|Torch-Compiled Region|## Call CompiledFxGraph|TorchDynamo"),
    ("XLA", r"XlaModule:|Thunk:|(?:jit|pjit|pmap)_[\w.]+(?:\(\d+\))?$"),
)
_COMPILED = tuple((library, re.compile(pattern)) for library, pattern in LIBRARY_RANGES)
_MODULE_INDEX = re.compile(r"(?<=\.)\d+(?=[.)\s]|$)")  # `blocks.3`, `transformer.h.3.attn`


def library_of(name: str) -> str | None:
    """The library that opens ranges named `name` (`LIBRARY_RANGES`), None for the program's own."""
    return next((library for library, pattern in _COMPILED if pattern.match(name)), None)


def group_name(name: str) -> str:
    """`name` with its module indices as ``*``: one report row for a range repeated per block."""
    return _MODULE_INDEX.sub("*", name)
