"""Fallback when nsys is missing: each framework's own profiler, read into the same `Profile`.

Recording is the backends' (`harness.backends.profilers`). Reading:
`harness.trace.sources.kineto` reads the Chrome trace torch.profiler exports;
`load_jax_trace` takes an ``.xplane.pb`` (or the directory
`harness.backends.profilers.jax_profiler` wrote) and reads it with ``jax.profiler.ProfileData``: kernels are the
events of the ``/device:GPU:N`` planes' stream lines, ranges the host-plane events named
like the harness's ranges (the host plane holds every runtime event too).
`load_jax_trace_viewer` reads the same XSpace from the trace-viewer export written beside
it (``<host>.trace.json.gz``, the file users open in Perfetto), by the same rules.

On a machine without a GPU there are no kernels; the loaders then take CPU work as
"kernels", mark the profile `cpu_ops` and say so in `Profile.notes`: torch's ``cpu_op``
events and XLA's CPU thunks (host events carrying an ``hlo_op`` stat), each by its self
time (its duration less that of the ops nested in it, the "self CPU" of torch.profiler's
tables; a ``while`` thunk holds its body's thunks).  Self time, not the innermost op: the
op that does the work often calls others that do none (``aten::mm`` calls
``aten::resolve_conj``), and a caller's whole duration would count its callees twice.
"""

from __future__ import annotations

import gzip
from collections.abc import Collection, Iterable
from pathlib import Path

import numpy as np

from harness.trace.profile import (
    HARNESS_RANGES,
    KERNEL,
    MEMCPY,
    MEMSET,
    UNKNOWN,
    Kernel,
    KernelTable,
    Profile,
    ProfileError,
    Range,
    label_from_path,
)
from harness.trace.sources.kineto import CPU_NOTE, load_torch_trace, ns, read_trace, self_times
from harness.trace.sources.registry import LoadOptions, source

HOST_PLANE, GPU_PLANE = "/host:CPU", "/device:GPU:"


def _xplane_file(path: Path) -> Path:
    """The trace file of `path`: itself, or the one trace of the folder jax.profiler.start_trace
    wrote (DIR/plugins/profile/<run>/<host>.xplane.pb). Any other folder, or one holding
    several traces, is refused: a trace picked from elsewhere would be a silently wrong report."""
    if path.is_file():
        return path
    found = sorted([*path.glob("*.xplane.pb*"), *path.glob("plugins/profile/*/*.xplane.pb*")])
    if not found:
        raise ProfileError(f"{path}: a folder without a JAX trace (DIR/plugins/profile/<run>/<host>.xplane.pb); name "
                           "the folder given to jax.profiler.start_trace, or the .xplane.pb file")
    if len(found) > 1:
        raise ProfileError(f"{path}: {len(found)} JAX traces in it ({found[0].name}, ...); name the .xplane.pb "
                           "file to analyse")
    return found[0]


def load_jax_trace(path: str | Path, label: str | None = None,
                   range_names: Collection[str] = HARNESS_RANGES) -> Profile:
    """Read a JAX profiler trace (``.xplane.pb[.gz]`` or its directory) into a `Profile`.

    Host-plane events named in `range_names` become ranges, and so do the steps a program
    marks with ``jax.profiler.StepTraceAnnotation`` (events carrying a ``step_num`` stat:
    the range keeps the step's number). A GPU event's launch is the host event with the
    same ``correlation_id`` (a kernel launch, or the ``cuGraphLaunch`` of the CUDA graph
    XLA runs it in): where it is there, kernels can be attributed by launch.
    """
    from jax.profiler import ProfileData

    xplane = _xplane_file(Path(path))
    try:
        raw = xplane.read_bytes()
        data = ProfileData.from_serialized_xspace(gzip.decompress(raw) if xplane.suffix == ".gz" else raw)
    except Exception as exc:  # the reader raises bare RuntimeError/ValueError on bad input
        raise ProfileError(f"{xplane}: not a JAX profiler trace ({exc})") from None
    events = ((plane.name, line_no, line.name, e.name, int(e.start_ns), int(e.start_ns + e.duration_ns), e.stats)
              for plane in data.planes if plane.name == HOST_PLANE or plane.name.startswith(GPU_PLANE)
              for line_no, line in enumerate(plane.lines) for e in line.events)
    return _jax_profile(events, xplane, label or label_from_path(path), range_names)


def is_trace_viewer(trace: dict) -> bool:
    """Whether a Chrome trace is jax.profiler's trace-viewer export (``<host>.trace.json.gz``,
    the file Perfetto opens): its processes are the XSpace's planes, named ``/host:CPU`` and
    ``/device:GPU:N``."""
    return any(e.get("ph") == "M" and e.get("name") == "process_name"
               and str((e.get("args") or {}).get("name", "")).startswith((HOST_PLANE, "/device:"))
               for e in trace.get("traceEvents", ()) if isinstance(e, dict))


def load_jax_trace_viewer(path: str | Path, label: str | None = None, trace: dict | None = None,
                          range_names: Collection[str] = HARNESS_RANGES) -> Profile:
    """Read jax.profiler's trace-viewer export (``<host>.trace.json[.gz]``, written beside the
    ``.xplane.pb``) into a `Profile`, by `load_jax_trace`'s rules.

    The export is the XSpace as a Chrome trace: each plane a process (``process_name``
    metadata: ``/host:CPU``, ``/device:GPU:N``), each line a thread (``thread_name``:
    ``Stream #14(Compute)``, ``python3``), each event a complete event (``"ph": "X"``, µs
    printed as doubles, ``1.3120000000000001``: read to the nearest ns) whose ``args`` are
    the event's stats as strings
    (``correlation_id``, ``step_num``, ``hlo_op``). `trace`: the file, parsed already."""
    path = Path(path)
    trace = trace if trace is not None else read_trace(path)
    raw = [e for e in trace["traceEvents"] if isinstance(e, dict)]
    names = {(e.get("pid"), e.get("tid") if e.get("name") == "thread_name" else None): str(e["args"]["name"])
             for e in raw if e.get("ph") == "M" and e.get("name") in ("process_name", "thread_name")
             and isinstance(e.get("args"), dict) and "name" in e["args"]}
    # Lines are numbered in order, as the XSpace's are: the export's thread ids (the OS's, on the
    # host) would read as several processes, and one process drives every device.
    lines: dict[tuple, int] = {}
    events = ((names.get((e.get("pid"), None), ""), lines.setdefault((e.get("pid"), e.get("tid")), len(lines)),
               names.get((e.get("pid"), e.get("tid")), ""), e["name"], ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]),
               e.get("args") or {})
              for e in raw if e.get("ph") == "X" and "dur" in e and "ts" in e
              and (e.get("args") or e.get("name") in range_names))  # the Python tracer's carry no args
    return _jax_profile(events, path, label or label_from_path(path), range_names)


def _jax_profile(events: Iterable[tuple], path: Path, label: str, range_names: Collection[str]) -> Profile:
    """The `Profile` of an XSpace's events, each (plane, line id, line name, name, start ns,
    end ns, stats): kernels from the GPU planes' stream lines, launches, steps, ranges and
    (without a GPU) XLA's CPU thunks from the host plane."""
    gpu, ranges, cpu_ops, launches = [], [], [], {}
    for plane, line_id, line, name, start, end, stats in events:
        if plane.startswith(GPU_PLANE):
            if line.startswith("Stream"):
                corr = dict(stats).get("correlation_id", UNKNOWN)
                gpu.append((name, start, end, int(plane.rsplit(":", 1)[1]), line_id, int(corr)))
        elif plane == HOST_PLANE:
            stats = dict(stats)
            if "correlation_id" in stats:
                launches[int(stats["correlation_id"])] = line_id, start
            if "step_num" in stats:
                ranges.append(Range(name, start, end, line_id, int(stats["step_num"])))
            elif name in range_names:
                ranges.append(Range(name, start, end, line_id))
            elif "hlo_op" in stats:
                cpu_ops.append(Kernel(name, start, end, 0, line_id, line_id))
    notes = []
    if gpu:
        kernels = _gpu_table(gpu, launches)
    else:
        kernels = KernelTable.from_kernels(self_times(cpu_ops))  # a `while` thunk holds its body's thunks
        notes.append(CPU_NOTE.format(what="XLA thunks (host events with an hlo_op stat, each by its self time)"))
    if not len(kernels):
        raise ProfileError(f"{path}: neither GPU kernels nor XLA CPU ops in the trace; was a "
                           "jitted computation run inside the profiler's block?")
    return Profile(str(path), label, "jax.profiler", kernels, sorted(ranges, key=lambda r: r.start), notes,
                   cpu_ops=not gpu)


def _gpu_table(gpu: list[tuple], launches: dict[int, tuple[int, int]]) -> KernelTable:
    """The device planes' events as a `KernelTable`, joined to their host launch events."""
    names = sorted({g[0] for g in gpu})
    index = {n: i for i, n in enumerate(names)}
    kinds = {"Memcpy": MEMCPY, "Memset": MEMSET}
    name, start, end, device, stream, corr = zip(*gpu)
    thread, launch = zip(*(launches.get(c, (UNKNOWN, UNKNOWN)) for c in corr))
    col = lambda v, dtype=np.int64: np.array(v, dtype=dtype)  # noqa: E731
    return KernelTable(names, col([index[n] for n in name], np.int32), col(start), col(end),
                       col([kinds.get(n[:6], KERNEL) for n in name], np.int8), col(device), col(stream),
                       col(thread), col(launch), col(corr))


@source("profiler-json", claims=lambda p: p.name.endswith((".json", ".json.gz")), describe="a torch.profiler .json")
def _load_json(path: Path, options: LoadOptions) -> Profile:
    """A torch.profiler trace, or JAX's trace-viewer export (told apart by `is_trace_viewer`)."""
    trace = read_trace(path)
    if is_trace_viewer(trace):
        return load_jax_trace_viewer(path, options.label, trace)
    return load_torch_trace(path, options.label, trace)


@source("jax-xplane", claims=lambda p: p.name.endswith((".xplane.pb", ".xplane.pb.gz")) or p.is_dir(),
        describe="a JAX .xplane.pb (or its .trace.json.gz)")
def _load_xplane(path: Path, options: LoadOptions) -> Profile:
    """A JAX profiler trace: the ``.xplane.pb`` file, or the folder `jax.profiler` wrote."""
    return load_jax_trace(path, options.label)
