"""`xfprof <tool> ...`: one command for every `python -m harness.<tool>` entry point.

    xfprof compare --model tiny --ctx 64        # the same as python -m harness.compare ...
    xfprof bench-attention --help               # harness/bench_attention.py
    xfprof --version

The subcommands are the modules of this package that run as programs (those ending in an
``if __name__ == "__main__":`` block), found from the package's files, so a new entry point
is a subcommand without a second list to keep; underscores become dashes. Each subcommand
hands the rest of the command line to its module's ``main(argv)``, which parses it. Found
by reading the source, not importing it, so ``--help`` lists the tools without loading
torch or JAX.
"""

from __future__ import annotations

import ast
import importlib
import shutil
import sys
import textwrap
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from harness import starting

PACKAGE = Path(__file__).resolve().parent
_GUARD = 'if __name__ == "__main__":'


def entry_points() -> dict[str, str]:
    """Subcommand -> module name (``bench-attention`` -> ``bench_attention``), sorted."""
    found = {}
    for path in sorted(PACKAGE.glob("*.py")):
        if not path.stem.startswith("_") and _GUARD in path.read_text():
            found[path.stem.replace("_", "-")] = path.stem
    return found


def summary(module: str) -> str:
    """The first sentence of the module's docstring (read from its source), whole: `usage`
    wraps it rather than cutting it short."""
    doc = ast.get_docstring(ast.parse((PACKAGE / f"{module}.py").read_text())) or ""
    return " ".join(doc.split("\n\n")[0].split()).split(". ")[0].rstrip(".:")


def version() -> str:
    """The installed distribution's version ("unknown" when run from a checkout not installed)."""
    try:
        return metadata.version("xfprof")
    except metadata.PackageNotFoundError:
        return "unknown"


def usage(columns: int | None = None) -> str:
    """The top-level help: every command with its summary, wrapped to `columns` (default: the
    terminal's width, at least 60) under the summaries' column."""
    tools = entry_points()
    width = max(map(len, tools))
    columns = columns or max(60, shutil.get_terminal_size().columns)
    lines = [textwrap.fill(summary(module), columns, initial_indent=f"  {name:<{width}}  ",
                           subsequent_indent=" " * (width + 4), break_on_hyphens=False)
             for name, module in tools.items()]
    return ("usage: xfprof [--version] [--help] <command> [options]\n\n"
            "Cross-framework profiling workbench: each command is `python -m harness.<module>`\n"
            "(`xfprof <command> --help` for its options).\n\ncommands:\n" + "\n".join(lines) + "\n")


def launcher() -> str:
    """How the user started this dispatcher, as their tools' errors should name it:
    `python -m harness`, else `xfprof` (the console script)."""
    return "python -m harness" if sys.orig_argv[1:3] == ["-m", "harness"] else "xfprof"


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch `argv` (default: the command line) to the named tool; its exit status."""
    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]) and argv[1:]:
        argv = [*argv[1:], argv[0]]  # `xfprof -h compare`: compare's help, not this one
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), end="")
        return 0
    if argv[0] == "--version":
        print(f"xfprof {version()}")
        return 0
    tools = entry_points()
    if argv[0] not in tools:
        print(f"error: unknown command {argv[0]!r}; choose one of {', '.join(tools)} (see xfprof --help)",
              file=sys.stderr)
        return 2
    if from_command_line:
        starting()  # as under `python -m`: a signal while the tool imports ends it in one line
    from harness.cli import dialect as cli

    module = importlib.import_module(f"harness.{tools[argv[0]]}")
    before, cli.LAUNCHER = cli.LAUNCHER, launcher()
    try:
        return module.main(argv[1:])
    finally:
        cli.LAUNCHER = before


if __name__ == "__main__":
    sys.exit(main())
