"""The framework profilers a backend runs when nsys is not used (`--profile`): torch.profiler
writing a Chrome trace, jax.profiler writing an XPlane. `harness.trace.sources.framework_profile`
reads what they write."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def torch_profiler(out_path: str | Path) -> Iterator[object]:
    """Profile the block with torch.profiler (CPU, plus CUDA where available) and write
    its Chrome trace to `out_path` (``.json``)."""
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        yield prof
    prof.export_chrome_trace(str(out_path))


@contextlib.contextmanager
def jax_profiler(out_dir: str | Path) -> Iterator[None]:
    """Trace the block with jax.profiler into `out_dir` (an ``.xplane.pb`` lands below it).

    Host tracing at level 1 (annotations and XLA's thunks; no Python tracer, no HLO
    protos) keeps the file small enough to keep."""
    import jax

    options = jax.profiler.ProfileOptions()
    options.host_tracer_level, options.python_tracer_level, options.enable_hlo_proto = 1, 0, False
    jax.profiler.start_trace(str(out_dir), profiler_options=options)
    try:
        yield
    finally:
        jax.profiler.stop_trace()
