"""One profile file into a `Profile`, whichever tool wrote it: the registered source that
claims the file's name reads it (`harness.trace.sources.registry`)."""

from __future__ import annotations

from pathlib import Path

from harness.trace.profile import Profile, ProfileError
from harness.trace.sources import framework_profile, kineto, nsys  # noqa: F401  (the built-in sources, first)
from harness.trace.sources.registry import LoadOptions, discover, source_of


def load_profile(path: str | Path, label: str | None = None, nsys_bin: str | None = None,
                 force: bool = False) -> Profile:
    """Load a profile by its file name: ``.nsys-rep`` (exported with nsys), ``.sqlite[.gz]``,
    a torch.profiler trace (``.json[.gz]``) or a JAX profiler trace (``.xplane.pb``, or its
    trace-viewer export ``.trace.json.gz``, told from torch's by its ``/host:CPU`` process),
    or any other registered source's file. `force`: analyse an nsys export whose importer
    lost kernel records."""
    path = Path(path)
    if not path.exists():
        raise ProfileError(f"{path}: no such file")
    found = source_of(path)
    if found is None:
        *rest, last = [s.describe for s in discover().values()]
        expected = f"{', '.join(rest)} or {last}" if rest else last
        raise ProfileError(f"{path}: not a profile; expected {expected}")
    return found.load(path, LoadOptions(label, nsys_bin, force))


def launches_of(path: str | Path, nsys_bin: str | None = None) -> dict:
    """Kernel-launch calls per phase (`harness.trace.sources.nsys_launches.Launches`) as the
    source of `path` records them; empty where it records none (or no source claims it)."""
    path = Path(path)
    found = source_of(path)
    return found.launches(path, LoadOptions(nsys_bin=nsys_bin)) if found and found.launches else {}
