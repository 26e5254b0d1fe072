"""The workbench's tools, each run as `python -m harness.<tool>` (or `xfprof <tool>`).

Importing a tool takes seconds (torch, JAX, matplotlib). A Ctrl-C in that time would print
a traceback of some import deep inside a library, and one landing while the interpreter
sets up or tears down its streams dumps its state instead; so while a tool started from
the command line is still importing, Ctrl-C or a stop signal ends it with one line and exit
code 130 (nothing has run yet, so nothing is lost). `started`, called when the tool parses
its arguments, gives Ctrl-C back to Python (KeyboardInterrupt), and makes the stop signals
(`STOP_SIGNALS`: SIGTERM, which `timeout`, batch schedulers and container stops send, and
SIGHUP, a closed terminal's) raise it too, so every tool keeps its finished work, and stops
its children, the same way on any of them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence

# Signals that stop a started tool the way Ctrl-C does (one ignored, as under nohup, stays ignored).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """A stop signal once a tool has started (its name the argument): handled wherever
    Ctrl-C is, as Ctrl-C."""


def _interrupted_while_starting(signum: int, frame: object) -> None:
    os.write(2, b"error: interrupted while starting; nothing ran\n")
    os._exit(130)


def _terminated(signum: int, frame: object) -> None:
    """A stop signal raises `Terminated` once; a repeat (a process group's signal, then the
    parent's forwarding of it) must not cut short the keeping of what finished; SIGKILL
    still ends it."""
    signal.signal(signum, signal.SIG_IGN)
    raise Terminated(signal.Signals(signum).name)


def starting() -> None:
    """While a tool started from the command line imports: Ctrl-C and the stop signals end it in one line."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted_while_starting)
    for stop in STOP_SIGNALS:
        if signal.getsignal(stop) == signal.SIG_DFL:
            signal.signal(stop, _interrupted_while_starting)


def started() -> None:
    """Ctrl-C raises KeyboardInterrupt again from here on, and the stop signals raise
    `Terminated` (see the module docstring); in a tool started from the command line only,
    so a caller of a tool's `main` keeps its own handlers."""
    if signal.getsignal(signal.SIGINT) is _interrupted_while_starting:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for stop in STOP_SIGNALS:
        if signal.getsignal(stop) is _interrupted_while_starting:
            signal.signal(stop, _terminated)


def stopped_by(exc: KeyboardInterrupt) -> str:
    """The signal behind a KeyboardInterrupt, as a message names it: "SIGTERM", "SIGHUP" or "Ctrl-C"."""
    return str(exc.args[0]) if isinstance(exc, Terminated) and exc.args else "Ctrl-C"


@contextlib.contextmanager
def held_signals() -> Iterator[None]:
    """Ctrl-C and the stop signals wait until the block is done (a result being written is
    written whole), then arrive as usual, once. Held by Python-level handlers, not by the
    thread's signal mask: a mask holds nothing once any other thread of the process (a
    progress line, a library's pool) takes the signal, and Python runs its handler in the
    main thread all the same. Off the main thread, where no handler can be set, nothing is held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    # an ignored signal stays ignored; one whose handler was not set from Python is left alone
    previous = {s: h for s in (signal.SIGINT, *STOP_SIGNALS)
                if (h := signal.getsignal(s)) not in (signal.SIG_IGN, None)}
    for s in previous:
        signal.signal(s, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if caught:
            signal.raise_signal(caught[0])


@contextlib.contextmanager
def child_process(cmd: Sequence[str], *, grace_s: float = 10.0, **popen: object) -> Iterator[subprocess.Popen]:
    """`subprocess.Popen(cmd, **popen)` that does not outlive the block it is used in: left by
    an exception (Ctrl-C, a stop signal), the child is terminated, then killed after `grace_s`.
    It is started with the signals held: one landing inside Popen, after the fork, would
    otherwise leave a running child its caller never received; held, it arrives once the
    child is in hand."""
    proc = None
    try:
        with held_signals():
            proc = subprocess.Popen(cmd, **popen)
        yield proc
    except BaseException:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        raise


# sys.argv[0] is "-m" while `python -m` imports the tool's package, and only then.
if sys.argv[:1] == ["-m"]:
    starting()
