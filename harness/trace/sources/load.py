"""One profile file into a `Profile`, whichever tool wrote it: the file name says which reader."""

from __future__ import annotations

from pathlib import Path

from harness.trace.profile import Profile, ProfileError
from harness.trace.sources import framework_profile, kineto, nsys


def load_profile(path: str | Path, label: str | None = None, nsys_bin: str | None = None,
                 force: bool = False) -> Profile:
    """Load a profile by its file name: ``.nsys-rep`` (exported with nsys), ``.sqlite[.gz]``,
    a torch.profiler trace (``.json[.gz]``) or a JAX profiler trace (``.xplane.pb``, or its
    trace-viewer export ``.trace.json.gz``, told from torch's by its ``/host:CPU`` process).
    `force`: analyse an nsys export whose importer lost kernel records."""
    path = Path(path)
    name = path.name
    if not path.exists():
        raise ProfileError(f"{path}: no such file")
    if name.endswith(".nsys-rep"):
        return nsys.read_sqlite(nsys.export_sqlite(path, nsys_bin), label, force)
    if name.endswith((".sqlite", ".sqlite.gz")):
        return nsys.read_sqlite(path, label, force)
    if name.endswith((".json", ".json.gz")):
        trace = kineto.read_trace(path)
        if framework_profile.is_trace_viewer(trace):
            return framework_profile.load_jax_trace_viewer(path, label, trace)
        return kineto.load_torch_trace(path, label, trace)
    if name.endswith((".xplane.pb", ".xplane.pb.gz")) or path.is_dir():
        return framework_profile.load_jax_trace(path, label)
    raise ProfileError(f"{path}: not a profile; expected .nsys-rep, .sqlite[.gz] (nsys export), "
                       "a torch.profiler .json or a JAX .xplane.pb (or its .trace.json.gz)")
