"""The harness's shape: one CLI dialect in every entry point, imports without cycles, small modules."""

from __future__ import annotations

import argparse
import ast
import importlib
from pathlib import Path

import pytest

from harness.__main__ import entry_points

HARNESS = Path(__file__).resolve().parent.parent / "harness"
ENTRY_POINTS = tuple(entry_points().values())
MAX_LINES = 400
# The harness's layers, lowest first: a module imports only from its own layer or below
# (entry points, harness/*.py, from any). The vocabulary and the shared pieces; the
# backends (records and implementations); the CLI dialect that lists them; reading traces,
# and the attention kernels' own harness; measuring a run; analysing sweeps and diffs;
# rendering every document; orchestrating processes.
LAYERS = {"config": 0, "common": 0, "backends": 1, "cli": 2, "trace": 3, "attention": 3, "timing": 4,
          "sweeps": 5, "diffs": 5, "reports": 6, "runs": 7}


def _parser(name: str) -> argparse.ArgumentParser:
    """The entry point's parser, caught from its main([--help]) when it builds one inline."""
    module = importlib.import_module(f"harness.{name}")
    if hasattr(module, "build_parser"):
        return module.build_parser()
    caught: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.parse_args

    def grab(self, *args, **kwargs):
        caught.append(self)
        raise SystemExit(0)

    argparse.ArgumentParser.parse_args = grab
    try:
        with pytest.raises(SystemExit):
            module.main(["--help"])
    finally:
        argparse.ArgumentParser.parse_args = original
    return caught[0]


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_entry_point_speaks_the_dialect(name: str) -> None:
    parser = _parser(name)
    assert parser.allow_abbrev is False
    options = {flag: action for action in parser._actions for flag in action.option_strings}
    for flag, action in options.items():
        if flag in ("-h", "--help") or action.help == argparse.SUPPRESS:
            continue
        assert action.help, f"{name} {flag}: no help text"
    if "--device" in options:
        action = options["--device"]
        choices = tuple(action.choices or getattr(action.type, "valid", ()))
        assert choices == ("cuda", "cpu"), f"{name} --device takes {choices}"
    assert not {"--results-dir", "--json", "--models", "--backends"} & set(options), name
    if "--nsys" in options:
        assert options["--nsys"].nargs == 0, f"{name}: --nsys is a flag; the binary is --nsys-bin"


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_help_shows_every_option_s_choices_and_default(name: str) -> None:
    """Each option's help line, as --help prints it, lists the choices it takes and its default."""
    parser = _parser(name)
    formatter = parser._get_formatter()
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS or "-h" in action.option_strings:
            continue
        text = " ".join(formatter._expand_help(action).split())
        flag = action.option_strings[0]
        for valid in action.choices or getattr(action.type, "valid", None) or ():
            assert str(valid) in text, f"{name} {flag}: choice {valid!r} not in its help: {text}"
        if action.required or isinstance(action.default, bool):  # nothing to show: it must be given, or a switch
            assert "default:" not in text, f"{name} {flag}: a default shown for a required option or switch: {text}"
        elif action.default is None:  # "(default: None)" says nothing; the help says what None means, if anything
            assert "default:" not in text, f"{name} {flag}: (default: None) in: {text}"
        elif action.default == []:  # a repeatable option given no times: "(default: )" says nothing
            assert "default:" not in text, f"{name} {flag}: an empty default shown in: {text}"
        else:
            assert "default:" in text or "%(default)" in (action.help or ""), f"{name} {flag}: no default in: {text}"
            assert "[" not in text.split("default:")[-1], f"{name} {flag}: a Python list as default: {text}"


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_bad_device_is_one_line(name: str, capsys) -> None:
    parser = _parser(name)
    if not any("--device" in a.option_strings for a in parser._actions):
        pytest.skip("no --device")
    module = importlib.import_module(f"harness.{name}")
    with pytest.raises(SystemExit) as exit_:
        module.main(["--device", "gpu"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "gpu" in err and "cuda" in err and "Traceback" not in err


def _modules() -> dict[str, Path]:
    return {".".join(("harness", *p.relative_to(HARNESS).with_suffix("").parts)).removesuffix(".__init__"): p
            for p in HARNESS.rglob("*.py")}


def _imports(path: Path, name: str) -> set[str]:
    """harness modules that `path` imports anywhere (top level or inside functions)."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base]).strip(".")
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in found if m.startswith("harness")}


def test_import_graph_has_no_cycle_and_goes_one_way() -> None:
    modules = _modules()
    graph = {m: {d for d in _imports(p, m) if d in modules and d != m} for m, p in modules.items()}
    # Importing a package runs its __init__: a module depends on the packages of what it
    # imports too, but for its own (a package's modules import each other as its __init__ runs).
    for m, deps in graph.items():
        deps |= {d.rpartition(".")[0] for d in set(deps) if d.rpartition(".")[0] in modules and
                 d.rpartition(".")[0] != "harness" and not (m + ".").startswith(d.rpartition(".")[0] + ".")}
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in graph[m]:
            if state.get(d) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*stack[stack.index(d):], m, d]))
            if d not in state:
                visit(d, [*stack, m])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [m])
    entry_points = {m for m, p in modules.items() if p.parent == HARNESS and p.name not in ("__init__.py", "__main__.py", "config.py")}
    assert {f"harness.{n}" for n in ENTRY_POINTS} == entry_points
    entry_points.add("harness.__main__")  # the dispatcher: an entry point over all of them
    for m, deps in graph.items():
        if m in entry_points or m == "harness":
            continue  # entry points may import anything below them
        for d in deps - {"harness"}:  # the package: its stop-signal handling, below everything
            assert d not in entry_points, f"{m} imports the entry point {d}"
            below, above = d.split(".")[1], m.split(".")[1]
            assert LAYERS[below] <= LAYERS[above], f"{m} imports {d}: upward ({below} is above {above})"
    attention = {d for m, deps in graph.items() if m.startswith("harness.attention") for d in deps}
    assert all(d.startswith(("harness.attention", "harness.common", "harness.config", "harness.cli"))
               for d in attention), sorted(attention)
    trace = {d for m, deps in graph.items() if m.startswith("harness.trace") for d in deps}
    # the backend registry (its names label profiles) sits below trace/; the CLI above it
    assert all(d.startswith(("harness.trace", "harness.common", "harness.config")) or d == "harness.backends"
               for d in trace), sorted(d for d in trace if d.startswith("harness.backends."))
    assert not any(d.startswith("harness.cli") for d in trace)


def test_every_folder_and_module_has_a_layer() -> None:
    """A new folder (or a module beside the entry points) is placed in the order explicitly."""
    tops = {p.relative_to(HARNESS).parts[0].removesuffix(".py") for p in HARNESS.rglob("*.py")
            if len(p.relative_to(HARNESS).parts) > 1 or p.stem in ("config", "__init__", "__main__")}
    tops -= {"__init__", "__main__"}
    assert tops == set(LAYERS), f"folders without a layer: {sorted(tops - set(LAYERS))}; gone: {sorted(set(LAYERS) - tops)}"


def test_no_module_over_the_line_limit() -> None:
    long_ = {str(p.relative_to(HARNESS)): n for p in HARNESS.rglob("*.py")
             if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long_, f"modules over {MAX_LINES} lines: {long_}"


def test_cycle_detection_can_fail(tmp_path) -> None:
    """The walker above sees relative and in-function imports: a planted cycle is found."""
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("def f():\n    from harness.x import b\n")
    b.write_text("from . import a\n")
    assert "harness.x.b" in _imports(a, "harness.x.a")
    assert "harness.x.a" in _imports(b, "harness.x.b")


BACKEND_NAMES = ("torch", "torch-compile", "torch-compile-cg", "jax")


def _backend_name_comparisons(source: str) -> list[int]:
    """Lines of `source` that compare something with a backend's name: `== "jax"`,
    `in ("torch", ...)`, `.startswith("torch")`."""

    def names_a_backend(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in BACKEND_NAMES
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(names_a_backend(e) for e in node.elts)
        return False

    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(names_a_backend(n) for n in (node.left, *node.comparators)):
            lines.append(node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("startswith", "endswith") and any(names_a_backend(a) for a in node.args)):
            lines.append(node.lineno)
    return lines


def test_backend_names_are_compared_only_in_the_registry() -> None:
    """What a backend can do is asked of its record (harness.backends), never of its name."""
    found = {f"{p.relative_to(HARNESS)}:{line}" for p in HARNESS.rglob("*.py")
             if "backends" not in p.relative_to(HARNESS).parts[:1]
             for line in _backend_name_comparisons(p.read_text())}
    assert not found, f"backend names compared outside harness/backends/: {sorted(found)}"


def test_backend_name_comparisons_are_found() -> None:
    planted = ('if backend == "jax": pass\nif b not in ("torch-compile", "x"): pass\n'
               'ok = name.startswith("torch")\nif "jax" != b: pass\nif b == other: pass\n')
    assert _backend_name_comparisons(planted) == [1, 2, 3, 4]


# Library names that are also backend names, where they name the library: the attention tools'
# kernels (not backends).
LIBRARY_TABLES = ("attention",)


def _backend_name_tables(source: str) -> list[int]:
    """Lines of `source` holding a backend's name in a table: an element of a tuple, list or
    set, a dict key, a function's default or a field's."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        elements = []
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            elements = node.elts
        elif isinstance(node, ast.Dict):
            elements = [k for k in node.keys if k is not None]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            elements = [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            elements = [node.value]
        lines += [e.lineno for e in elements if isinstance(e, ast.Constant) and e.value in BACKEND_NAMES]
    return sorted(set(lines))


def test_backend_names_are_tabled_only_in_the_registry() -> None:
    """What differs between backends is a field of their record (harness.backends), never a
    table of their names elsewhere."""
    found = {f"{p.relative_to(HARNESS)}:{line}" for p in HARNESS.rglob("*.py")
             if p.relative_to(HARNESS).parts[0] != "backends"
             and not str(p.relative_to(HARNESS)).startswith(LIBRARY_TABLES)
             for line in _backend_name_tables(p.read_text())}
    assert not found, f"backend names tabled outside harness/backends/: {sorted(found)}"


def test_backend_name_tables_are_found() -> None:
    planted = ('PAIR = ("jax", "torch")\nx = {"torch-compile": 1}\ndef f(b="jax"): pass\n'
               'class R:\n    backend: str = "torch"\nok = ("fp32", "bf16")\n')
    assert _backend_name_tables(planted) == [1, 2, 3, 5]
