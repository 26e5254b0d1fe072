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


ATTENTION_STEPS = (("scores", "attn_scores"), ("softmax", "attn_softmax"), ("values", "attn_values"))


def annotate_attention(attention_cls: type, sync: Callable[[object], None]) -> None:
    """Wrap the naive attention's three steps (methods `scores`, `softmax`, `values` of
    `attention_cls`) in NVTX ranges `attn_scores`, `attn_softmax`, `attn_values`, each
    ended by `sync(result)` so the range covers its kernels. The syncs serialize the
    forward pass: such a run attributes time, it does not measure speed."""
    for method, range_name in ATTENTION_STEPS:
        original = getattr(attention_cls, method)

        def wrapped(self, *args, _original=original, _name=range_name):
            with phase_range(_name):
                out = _original(self, *args)
                sync(out)
            return out

        setattr(attention_cls, method, wrapped)
