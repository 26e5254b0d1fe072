"""The `xfprof` console script: one subcommand per entry-point module, dispatching to its main(argv)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from pathlib import Path

from harness.__main__ import entry_points, main

ROOT = Path(__file__).resolve().parent.parent


def _modules_with_main() -> set[str]:
    """harness/*.py defining a top-level main(): the entry points, counted independently of the guard."""
    out = set()
    for path in (ROOT / "harness").glob("*.py"):
        tree = ast.parse(path.read_text())
        if any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body) and path.stem != "__main__":
            out.add(path.stem)
    return out


def test_subcommands_are_the_entry_point_modules() -> None:
    tools = entry_points()
    assert set(tools.values()) == _modules_with_main()
    assert {"compare", "run", "report", "diff", "sweep", "parity", "scaling", "bench-attention"} <= set(tools)
    assert all(name == module.replace("_", "-") for name, module in tools.items())


def test_help_lists_every_subcommand(capsys) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    listed = [line.split()[0] for line in out.split("commands:\n")[1].splitlines()]
    assert listed == list(entry_points())


def test_version_is_the_package_metadata(capsys) -> None:
    assert main(["--version"]) == 0
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert capsys.readouterr().out == f"xfprof {project['version']}\n"
    assert project["scripts"]["xfprof"] == "harness.__main__:main"


def test_subcommand_runs_the_module(tmp_path, capsys) -> None:
    out = tmp_path / "mem.json"
    assert main(["memory-model", "--model", "tiny", "--ctx", "64", "--dtype", "fp32"]) == 0
    via_script = capsys.readouterr().out
    direct = subprocess.run([sys.executable, "-m", "harness.memory_model", "--model", "tiny", "--ctx", "64",
                             "--dtype", "fp32"], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert via_script == direct and "tiny" in via_script
    assert not out.exists()


def test_unknown_subcommand_is_one_line(capsys) -> None:
    assert main(["comapre"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'comapre'" in err and "compare" in err
    json.dumps(err)


def test_the_console_script_gives_its_tools_the_signal_handling_of_python_m(monkeypatch) -> None:
    """Started as `xfprof <tool>`, a tool treats SIGTERM as Ctrl-C once it has parsed its
    options, as under `python -m harness.<tool>`; a caller of main(argv) keeps its own handlers."""
    import signal
    import types

    import harness
    import harness.__main__ as launcher

    seen = []

    def tool_main(argv):
        harness.started()  # what every tool's parse_args does
        seen.append(signal.getsignal(signal.SIGTERM))
        return 0

    monkeypatch.setattr(launcher.importlib, "import_module", lambda name: types.SimpleNamespace(main=tool_main))
    monkeypatch.setattr(sys, "argv", ["xfprof", "memory-model"])
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        assert launcher.main(["memory-model"]) == 0 and seen == [before[1]]
        assert launcher.main() == 0 and seen[1] is harness._terminated
    finally:
        signal.signal(signal.SIGINT, before[0])
        signal.signal(signal.SIGTERM, before[1])
