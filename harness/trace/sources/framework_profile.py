"""Fallback when nsys is missing: each framework's own profiler, read into the same `Profile`.

Recording (the harness wraps its measured run in one of these, with
`harness.ranges.use_framework_annotations(backend)` so phase ranges become
``record_function`` / ``TraceAnnotation`` ranges as well as NVTX ones)::

    with framework_profile.torch_profiler("run.torch.json"):
        ...
    with framework_profile.jax_profiler("run.jax.trace"):   # a directory
        ...

Reading: `load_torch_trace` takes the Chrome trace torch.profiler exports (GPU kernels
are events of category ``kernel``/``gpu_memcpy``/``gpu_memset``; ranges are
``user_annotation``).  `load_jax_trace` takes an ``.xplane.pb`` (or the directory
`jax_profiler` wrote) and reads it with ``jax.profiler.ProfileData``: kernels are the
events of the ``/device:GPU:N`` planes' stream lines, ranges the host-plane events named
like the harness's ranges (the host plane holds every runtime event too).

On a machine without a GPU there are no kernels; the loaders then take CPU work as
"kernels", mark the profile `cpu_ops` and say so in `Profile.notes`: torch's ``cpu_op``
events and XLA's CPU thunks (host events carrying an ``hlo_op`` stat), each by its self
time (its duration less that of the ops nested in it, the "self CPU" of torch.profiler's
tables; a ``while`` thunk holds its body's thunks).  Self time, not the innermost op: the
op that does the work often calls others that do none (``aten::mm`` calls
``aten::resolve_conj``), and a caller's whole duration would count its callees twice.
"""

from __future__ import annotations

import contextlib
import gzip
import json
from collections import defaultdict
from collections.abc import Collection, Iterator
from pathlib import Path

from harness.trace.profile import HARNESS_RANGES, Kernel, Profile, ProfileError, Range, label_from_path

TORCH_GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
CPU_NOTE = ("no GPU activity in this trace: CPU {what} stand in for kernels, so times are "
            "host execution times, not GPU times")


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


def _read_json(path: Path) -> dict:
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProfileError(f"{path}: not a torch.profiler Chrome trace ({exc}); write one with "
                           "framework_profile.torch_profiler or prof.export_chrome_trace") from None


def self_times(ops: list[Kernel]) -> list[Kernel]:
    """CPU ops as kernels that last their self time: each op's duration less that of the
    ops nested directly in it on the same thread (`Kernel.stream`). Each starts where its
    op starts, so it lies inside the same ranges."""
    out = []
    by_thread: dict[int, list[Kernel]] = defaultdict(list)
    for k in ops:
        by_thread[k.stream].append(k)
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


def _ns(us: float | str) -> int:
    """Trace times are µs; profiles keep ns."""
    return int(round(float(us) * 1000))


def load_torch_trace(path: str | Path, label: str | None = None,
                     range_names: Collection[str] = HARNESS_RANGES) -> Profile:
    """Read a torch.profiler Chrome trace (``.json`` or ``.json.gz``) into a `Profile`.

    ``record_function`` ranges named in `range_names` become ranges (torch adds its own,
    such as ``Optimizer.step#AdamW.step``, which are left out).
    """
    path = Path(path)
    trace = _read_json(path)
    if "traceEvents" not in trace:
        raise ProfileError(f"{path}: JSON without traceEvents: not a torch.profiler trace")
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e]

    def kernel(e: dict) -> Kernel:
        args = e.get("args", {})
        return Kernel(e["name"], _ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]), int(args.get("device", 0)),
                      int(args.get("stream", e.get("tid", 0)) or 0), None)

    kernels = [kernel(e) for e in events if e.get("cat") in TORCH_GPU_CATEGORIES]
    notes = []
    if not kernels:
        kernels = self_times([kernel(e) for e in events if e.get("cat") == "cpu_op"])
        notes.append(CPU_NOTE.format(what="ops (each cpu_op event by its self time)"))
    ranges = [Range(e["name"], _ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]), e.get("tid"))
              for e in events if e.get("cat") == "user_annotation" and e["name"] in range_names]
    if not kernels:
        raise ProfileError(f"{path}: the trace holds neither GPU kernels nor CPU ops; "
                           "was anything run inside the profiler's block?")
    return Profile(str(path), label or label_from_path(path), "torch.profiler",
                   sorted(kernels, key=lambda k: k.start), sorted(ranges, key=lambda r: r.start), notes,
                   cpu_ops=bool(notes))


def _xplane_file(path: Path) -> Path:
    if path.is_file():
        return path
    found = sorted(path.rglob("*.xplane.pb*"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise ProfileError(f"{path}: no *.xplane.pb below it; is it the directory passed to "
                           "jax.profiler.start_trace / framework_profile.jax_profiler?")
    return found[-1]


def load_jax_trace(path: str | Path, label: str | None = None,
                   range_names: Collection[str] = HARNESS_RANGES) -> Profile:
    """Read a JAX profiler trace (``.xplane.pb[.gz]`` or its directory) into a `Profile`.

    Host-plane events named in `range_names` become ranges.
    """
    from jax.profiler import ProfileData

    xplane = _xplane_file(Path(path))
    try:
        raw = xplane.read_bytes()
        data = ProfileData.from_serialized_xspace(gzip.decompress(raw) if xplane.suffix == ".gz" else raw)
    except Exception as exc:  # the reader raises bare RuntimeError/ValueError on bad input
        raise ProfileError(f"{xplane}: not a JAX profiler trace ({exc})") from None
    kernels, ranges, cpu_ops = [], [], []
    for plane in data.planes:
        device = plane.name.startswith("/device:GPU:")
        for line_no, line in enumerate(plane.lines):
            for e in line.events:
                start, end = int(e.start_ns), int(e.start_ns + e.duration_ns)
                if device and line.name.startswith("Stream"):
                    kernels.append(Kernel(e.name, start, end, int(plane.name.rsplit(":", 1)[1]), line_no))
                elif plane.name == "/host:CPU":
                    if e.name in range_names:
                        ranges.append(Range(e.name, start, end, line_no))
                    elif any(k == "hlo_op" for k, _ in e.stats):
                        cpu_ops.append(Kernel(e.name, start, end, 0, line_no, line_no))
    notes = []
    if not kernels:
        kernels = self_times(cpu_ops)  # a `while` thunk holds its body's thunks
        notes.append(CPU_NOTE.format(what="XLA thunks (host events with an hlo_op stat, each by its self time)"))
    if not kernels:
        raise ProfileError(f"{xplane}: neither GPU kernels nor XLA CPU ops in the trace; was a "
                           "jitted computation run inside the profiler's block?")
    return Profile(str(xplane), label or label_from_path(path), "jax.profiler",
                   sorted(kernels, key=lambda k: k.start), sorted(ranges, key=lambda r: r.start), notes,
                   cpu_ops=bool(notes))
