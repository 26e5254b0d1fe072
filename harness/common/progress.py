"""Progress of long work on stderr: what a tool is doing, on what, and for how long.

A tool that reads a large profile, analyses it and draws it can work for minutes without
a word, which reads as a hang. `stage` wraps such a piece of work: once it has run
`AFTER_S` seconds it says what it does (with its counts: a file's size, a profile's
kernels), then every `EVERY_S` seconds how long so far, and at its end how long it took
and what it found. A stage that ends sooner says nothing, so small inputs (and the
tests) keep their output, and a failure its one line; a tool that reports every step
anyway (compare) has its stages speak at once.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator

AFTER_S = 2.0  # a stage says what it does once it has run this long
EVERY_S = 5.0  # then, while it runs, how long so far, at this interval


def say(tool: str, message: str) -> None:
    """One progress line on stderr: `[tool] message`."""
    print(f"[{tool}] {message}", file=sys.stderr, flush=True)


def file_size(path: str | os.PathLike) -> str:
    """A file's size for a progress line ("1.2 GB", "340 MB", "12 kB"); a folder's files summed."""
    try:
        if os.path.isdir(path):
            size = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)
        else:
            size = os.path.getsize(path)
    except OSError:
        return "size unknown"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


@contextlib.contextmanager
def stage(tool: str, what: str, now: bool = False) -> Iterator[Callable[[str], None]]:
    """Work that may run long (module docstring); `now`: say `what` at once (a tool that
    reports every step anyway). Yields `found(text)`: what the stage found ("2,345
    kernels"), added to its closing line where it said anything."""
    result: list[str] = []
    spoke = threading.Event()
    stop = threading.Event()
    start = time.monotonic()

    def watch() -> None:
        if not spoke.is_set():
            if stop.wait(AFTER_S):
                return
            say(tool, what)
            spoke.set()
        while not stop.wait(EVERY_S):
            say(tool, f"{what}: {time.monotonic() - start:.0f} s so far")

    if now or AFTER_S <= 0:
        say(tool, what)
        spoke.set()
    watcher = threading.Thread(target=watch, name=f"progress: {what}", daemon=True)
    watcher.start()
    try:
        yield result.append
    finally:
        stop.set()
        watcher.join()
    if spoke.is_set():
        found = f": {'; '.join(result)}" if result else ""
        say(tool, f"{what}: done in {time.monotonic() - start:.1f} s{found}")
