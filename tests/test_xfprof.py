"""The `xfprof` console script: one subcommand per entry-point module, dispatching to its main(argv)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from harness.__main__ import entry_points, main, usage
from harness.cli import dialect as cli

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
    listed = [line.split()[0] for line in out.split("commands:\n")[1].splitlines() if not line.startswith("   ")]
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


def _first_sentence(module: str) -> str:
    doc = ast.get_docstring(ast.parse((ROOT / "harness" / f"{module}.py").read_text()))
    return " ".join(doc.split("\n\n")[0].split()).split(". ")[0].rstrip(".:")


def test_help_gives_every_summary_whole_within_the_width() -> None:
    """Summaries over 90 characters were cut with "..." (9 of 16); they wrap instead."""
    text = usage(columns=80)
    assert "…" not in text and "..." not in text
    commands = text.split("commands:\n")[1]
    assert all(len(line) <= 80 for line in commands.splitlines())
    joined = " ".join(commands.split())
    for name, module in entry_points().items():
        assert f"{name} {_first_sentence(module)}" in joined
    assert "check they agree, report side by side" in joined  # compare's, past the old cut


def test_help_before_a_command_is_that_command_s_help(capsys) -> None:
    """`xfprof -h compare` printed the top-level help."""
    with pytest.raises(SystemExit) as exit_:
        main(["-h", "compare"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: xfprof compare ") and "--model" in out and "commands:" not in out


def test_errors_name_the_program_as_the_user_typed_it(capsys) -> None:
    """Through xfprof, an error says `see xfprof run --help`, not `python -m harness.run --help`;
    run directly, the module's name; and the launcher's name does not outlive the call."""
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--backend", "torch", "--ctx", "64", "--steps", "0"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == ("error: argument --steps: expected a positive integer, got '0' "
                                       "(see xfprof run --help)\n")
    assert cli.LAUNCHER is None
    with pytest.raises(SystemExit):
        main(["bench-optimizer", "--bogus"])
    assert "(see xfprof bench-optimizer --help)" in capsys.readouterr().err
    from harness import run

    with pytest.raises(SystemExit):
        run.main(["--backend", "torch", "--ctx", "64", "--steps", "0"])
    assert capsys.readouterr().err.endswith("(see python -m harness.run --help)\n")


def test_recorded_command_reruns_as_written(tmp_path, monkeypatch) -> None:
    """The documents' `command` read `python xfprof compare ... --out <basename>`: neither
    runnable (xfprof is a script on PATH, not a file here) nor writing where the run wrote."""
    import shlex

    from harness.common.results import command_line

    out = str(tmp_path / "my results")
    typed = ["compare", "--model", "tiny", "--ctx", "64", "--out", out]
    recorded = command_line(["/opt/venv/bin/python", "/opt/venv/bin/xfprof", *typed])
    assert recorded.startswith("xfprof compare --model tiny") and shlex.split(recorded) == ["xfprof", *typed]
    recorded = command_line(["/usr/bin/python3.11", "-m", "harness.compare", *typed[1:]])
    assert shlex.split(recorded) == ["python", "-m", "harness.compare", *typed[1:]]
    monkeypatch.setenv("HOME", str(tmp_path))  # a home folder's path is written ~/...: the shell expands it
    assert command_line(["python", "-m", "harness.run", "--out", out]) == "python -m harness.run --out ~/'my results'"


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
