"""Phase ranges: NVTX for Nsight Systems, plus the framework profiler's own annotation.

Ranges go to NVTX's default domain through NVIDIA's `nvtx` package for both backends.
(JAX's `TraceAnnotation` writes to XLA's "TSL" NVTX domain, which nsys's importer
mishandles, dropping every kernel record; nsys runs of JAX exclude that domain.)
When a framework profiler is recording instead of nsys, `use_framework_annotations`
makes each range also a `torch.profiler.record_function` or a JAX `TraceAnnotation`,
so the same analysis finds the same phase names.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import nvtx

_framework_annotation: Callable[[str], contextlib.AbstractContextManager] | None = None


def use_framework_annotations(backend: str | None) -> None:
    """Also annotate ranges for torch.profiler ("torch") or jax.profiler ("jax"); None turns it off."""
    global _framework_annotation
    if backend is None:
        _framework_annotation = None
    elif backend == "torch":
        import torch

        _framework_annotation = torch.profiler.record_function
    elif backend == "jax":
        import jax

        _framework_annotation = jax.profiler.TraceAnnotation
    else:
        raise ValueError(f"unknown backend {backend!r}; choose torch or jax")


@contextlib.contextmanager
def phase_range(name: str) -> Iterator[None]:
    """An NVTX push/pop range named `name` (a no-op when no profiler is attached)."""
    nvtx.push_range(name)
    try:
        if _framework_annotation is None:
            yield
        else:
            with _framework_annotation(name):
                yield
    finally:
        nvtx.pop_range()
