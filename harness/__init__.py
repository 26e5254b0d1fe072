"""The workbench's tools, each run as `python -m harness.<tool>`.

Importing a tool takes seconds (torch, JAX, matplotlib). A Ctrl-C in that time would print
a traceback of some import deep inside a library, and one landing while the interpreter
sets up or tears down its streams dumps its state instead; so while a tool started with
`-m` is still importing, Ctrl-C ends it with one line and exit code 130 (nothing has run
yet, so nothing is lost). `started`, called when the tool parses its arguments, gives
Ctrl-C back to Python (KeyboardInterrupt), which the tools handle to keep finished work.
"""

from __future__ import annotations

import os
import signal
import sys


def _interrupted_while_starting(signum: int, frame: object) -> None:
    os.write(2, b"error: interrupted while starting; nothing ran\n")
    os._exit(130)


def started() -> None:
    """Ctrl-C raises KeyboardInterrupt again from here on (see the module docstring)."""
    if signal.getsignal(signal.SIGINT) is _interrupted_while_starting:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# sys.argv[0] is "-m" while `python -m` imports the tool's package, and only then.
if sys.argv[:1] == ["-m"] and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _interrupted_while_starting)
