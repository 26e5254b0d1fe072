"""The trace sources: one module per profiler's file format, registered once.

A source module of this package says, with `source`, how to recognise its files (`claims`,
from the path alone: no file is opened to choose) and how to read one into a `Profile`
(`load`); where its format records the host's kernel-launch calls, how to count them per
phase (`launches`, `harness.trace.sources.nsys_launches.Launches`). `harness.trace.sources.load`
imports every module of the package (`discover`) and dispatches over the registry, so a new
format is one new module here: nothing else names it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.common.plugins import import_package
from harness.trace.profile import Profile


@dataclass(frozen=True)
class LoadOptions:
    """What a reader may be told beside the path: the column label (None: from the file
    name), the nsys binary (exporting an .nsys-rep) and `force` (an nsys export whose
    importer lost kernel records is analysed anyway)."""

    label: str | None = None
    nsys_bin: str | None = None
    force: bool = False


@dataclass(frozen=True)
class Source:
    """One registered file format."""

    name: str
    claims: Callable[[Path], bool]  # this path is this format's (by its name; a folder may be)
    load: Callable[[Path, LoadOptions], Profile]
    describe: str  # the files it reads, in words, for the error naming what is expected
    launches: Callable[[Path, LoadOptions], dict] | None = None  # launch calls per phase, where recorded


_SOURCES: dict[str, Source] = {}


def source(name: str, *, claims: Callable[[Path], bool], describe: str,
           launches: Callable[[Path, LoadOptions], dict] | None = None
           ) -> Callable[[Callable[[Path, LoadOptions], Profile]], Callable[[Path, LoadOptions], Profile]]:
    """Register the decorated reader `load(path, options) -> Profile` as the source `name`
    (registering a name again replaces it: a reloaded module is the same source)."""
    def register(load: Callable[[Path, LoadOptions], Profile]) -> Callable[[Path, LoadOptions], Profile]:
        _SOURCES[name] = Source(name, claims, load, describe, launches)
        return load
    return register


def unregister(name: str) -> None:
    """Drop the source `name` (a test's planted one)."""
    _SOURCES.pop(name, None)


def discover() -> dict[str, Source]:
    """Every source of this package, by name, in registration order: importing each module
    registers what it defines (modules already imported are not read again)."""
    import_package(__package__)
    return dict(_SOURCES)


def source_of(path: Path) -> Source | None:
    """The first registered source that claims `path`, None if none does."""
    return next((s for s in discover().values() if s.claims(path)), None)
