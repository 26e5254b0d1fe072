"""harness.ab: one cell timed from a commit's tree (A) and the working tree (B), interleaved,
then diffed; bad input refused before any run; a stopped A/B goes on where it stopped."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import types

import pytest

from harness import ab
from harness.common.provenance import ROOT, commit_digest, source_digest
from harness.runs import ab as runs

CELL = ["--backend", "torch", "--model", "tiny", "--ctx", "32", "--steps", "2", "--warmup", "1", "--device", "cpu",
        "--quiet"]


def _head() -> str | None:
    try:
        return runs.resolve_base("HEAD")
    except ValueError:
        return None


needs_git = pytest.mark.skipif(_head() is None, reason="not a git checkout with a commit")


def test_the_sides_take_turns() -> None:
    assert runs.order(3) == ["a-1", "b-1", "b-2", "a-2", "a-3", "b-3"]


def _fake_runs(monkeypatch, code: int, doc: dict) -> dict:
    """harness.run replaced by a stand-in that writes `doc` and exits with `code`; returns
    what each call was started with, by its working directory."""
    seen = {}

    @contextlib.contextmanager
    def child(cmd, **popen):
        seen[popen["cwd"]] = (cmd, popen["env"])
        with open(cmd[-1], "w") as f:
            json.dump(doc, f)
        yield types.SimpleNamespace(wait=lambda timeout=None: code)

    monkeypatch.setattr(runs, "child_process", child)
    return seen


def test_side_a_runs_from_the_commit_s_tree_and_b_from_the_working_tree(tmp_path, monkeypatch) -> None:
    seen = _fake_runs(monkeypatch, 0, {"status": "ok"})
    tree = tmp_path / "trees" / "c0ffee"
    for sub in ("runs", "logs"):
        (tmp_path / sub).mkdir()
    assert runs.run_one("a-1", CELL, tmp_path, ("c0ffee", tree), None) is None
    assert runs.run_one("b-1", CELL, tmp_path, ("c0ffee", tree), None) is None
    (cmd_a, env_a), (cmd_b, env_b) = seen[tree], seen[ROOT]
    assert env_a["XFPROF_GIT_COMMIT"] == "c0ffee" and env_a["PYTHONPATH"].split(os.pathsep)[0] == str(tree)
    assert env_b.get("XFPROF_GIT_COMMIT") == os.environ.get("XFPROF_GIT_COMMIT")
    assert env_b["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT)
    assert cmd_a[1:3] == ["-m", "harness.run"] and cmd_a[3:-2] == CELL
    assert cmd_a[-2:] == ["--out", str((tmp_path / "runs" / "a-1.json").resolve())]
    assert cmd_b[3:] == [*CELL, "--out", str((tmp_path / "runs" / "b-1.json").resolve())]


def test_without_a_base_both_sides_run_the_working_tree_each_with_its_settings(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XLA_FLAGS", "--from-the-shell")
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    seen = []

    @contextlib.contextmanager
    def child(cmd, **popen):
        seen.append((popen["cwd"], popen["env"]))
        with open(cmd[-1], "w") as f:
            json.dump({"status": "ok"}, f)
        yield types.SimpleNamespace(wait=lambda timeout=None: 0)

    monkeypatch.setattr(runs, "child_process", child)
    lines = []
    settings = {"a": {}, "b": {"XLA_FLAGS": "--xla_gpu_enable_command_buffer=", "NCCL_ALGO": ""}}
    assert runs.run_sides(None, CELL, tmp_path, 1, None, lines.append, settings) is None
    (cwd_a, env_a), (cwd_b, env_b) = seen
    assert cwd_a == cwd_b == ROOT and env_a.get("XFPROF_GIT_COMMIT") == os.environ.get("XFPROF_GIT_COMMIT")
    # A keeps the shell's settings; B's replace them, and an empty value removes one.
    assert (env_a["XLA_FLAGS"], env_a["NCCL_ALGO"]) == ("--from-the-shell", "Ring")
    assert env_b["XLA_FLAGS"] == "--xla_gpu_enable_command_buffer=" and "NCCL_ALGO" not in env_b
    assert lines == ["[1/2] a-1: A the working tree",
                     "[2/2] b-1: B the working tree, XLA_FLAGS=--xla_gpu_enable_command_buffer=, NCCL_ALGO unset"]


def _kept_doc(path, run_args, **env) -> None:
    from harness.common.results import command_line

    command = command_line(["python", "-m", "harness.run", *run_args, "--out", str(path)])
    path.write_text(json.dumps({"status": "ok", "env": {"command": command, **env}}))


@pytest.mark.parametrize(("doc_args", "env", "says"), [
    (CELL, {}, None),
    ([*CELL[:-1], "--seed", "1", "--quiet"], {}, "was run as `python -m harness.run --backend torch"),
    (CELL, {"source_sha256": "f" * 64}, "ran source fffffff, where the working tree is now"),
    (CELL, {"settings": {"XLA_FLAGS": "--old"}}, "ran with XLA_FLAGS=--old, where this A/B runs B with "
                                                 "XLA_FLAGS=--new"),
    (CELL, {"settings": {}}, "ran with XLA_FLAGS=(unset), where this A/B runs B with XLA_FLAGS=--new"),
])
def test_a_kept_run_must_be_what_this_ab_would_run(tmp_path, monkeypatch, doc_args, env, says) -> None:
    """A finished run's document is kept only where it ran the same harness.run options, tree
    and settings as this A/B would: given again after an edit, other options or other settings,
    the A/B refuses rather than mix two configurations into one side."""
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    (tmp_path / "runs").mkdir()
    base = "c0ffee" * 6 + "c0ff"
    settings = {"b": {"XLA_FLAGS": "--new"}}
    _kept_doc(tmp_path / "runs" / "a-1.json", CELL, git_commit=base)
    defaults = {"source_sha256": source_digest(), "settings": {"XLA_FLAGS": "--new"}}
    _kept_doc(tmp_path / "runs" / "b-1.json", doc_args, **{**defaults, **env})
    problem = runs.kept_problem(base, CELL, tmp_path, 1, settings)
    if says is None:
        assert problem is None
    else:
        assert problem.startswith(f"{tmp_path / 'runs' / 'b-1.json'} {says}")
        assert problem.endswith("give another --out, or remove the runs of the earlier A/B to run them again")
    # A's document must name --base's commit.
    _kept_doc(tmp_path / "runs" / "a-1.json", CELL, git_commit="0" * 40)
    problem = runs.kept_problem(base, CELL, tmp_path, 1, settings)
    assert problem.startswith(f"{tmp_path / 'runs' / 'a-1.json'} ran commit 0000000, where this A/B's --base is "
                              f"{base[:7]}")


def test_the_command_refuses_a_mismatched_kept_run_as_bad_input(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(runs, "child_process", lambda *a, **k: pytest.fail("a run started"))
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    out = tmp_path / "ab"
    (out / "runs").mkdir(parents=True)
    _kept_doc(out / "runs" / "b-1.json", CELL, source_sha256="f" * 64, settings={"XLA_FLAGS": "x"})
    assert _exit_code(["--env-b", "XLA_FLAGS=x", "--runs", "1", "--out", str(out), "--", *CELL]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "b-1.json ran source fffffff, where the working tree is now" in err[0]
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["b-1.json"]


def test_a_failed_run_says_so_and_where_its_log_is(tmp_path, monkeypatch) -> None:
    _fake_runs(monkeypatch, 3, {"status": "failed", "error": "out of memory"})
    for sub in ("runs", "logs"):
        (tmp_path / sub).mkdir()
    problem = runs.run_one("b-2", CELL, tmp_path, ("c0ffee", tmp_path), None)
    assert problem == f"b-2 failed (exit 3): out of memory; its log: {tmp_path / 'logs' / 'b-2.log'}"


def test_a_failed_run_is_run_again_from_scratch(tmp_path, monkeypatch) -> None:
    # harness.run refuses to replace a document: the failed attempt's goes first.
    for sub in ("runs", "logs"):
        (tmp_path / sub).mkdir()
    stale = tmp_path / "runs" / "a-1.json"
    stale.write_text(json.dumps({"status": "failed", "error": "interrupted by SIGTERM"}))
    seen = {}

    @contextlib.contextmanager
    def child(cmd, **popen):
        seen["existed"] = stale.exists()
        yield types.SimpleNamespace(wait=lambda timeout=None: 1)

    monkeypatch.setattr(runs, "child_process", child)
    problem = runs.run_one("a-1", CELL, tmp_path, ("c0ffee", tmp_path), None)
    assert seen["existed"] is False
    assert problem == f"a-1 failed (exit 1); its log: {tmp_path / 'logs' / 'a-1.log'}"


@needs_git
def test_the_base_tree_is_exactly_the_commit_s_shipped_files(tmp_path) -> None:
    head = _head()
    assert source_digest(runs.unpack_tree(head, tmp_path)) == commit_digest(head)


def test_a_carried_tree_runs_without_git(tmp_path, monkeypatch) -> None:
    sha = "0123456789abcdef0123456789abcdef01234567"
    monkeypatch.setattr(runs, "TREES", tmp_path / "trees")
    monkeypatch.setattr(runs, "ROOT", tmp_path / "a-copy-without-git")
    with pytest.raises(ValueError, match=f"--base {sha}: git could not be run here"):
        runs.resolve_base(sha)
    (tmp_path / "trees" / sha).mkdir(parents=True)
    assert runs.resolve_base(sha) == sha


@needs_git
def test_unpack_only_puts_the_tree_in_place_and_stops(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(runs, "TREES", tmp_path / "trees")
    assert ab.main(["--base", "HEAD", "--unpack-only", "--out", str(tmp_path / "ab")]) == 0
    head = _head()
    assert (tmp_path / "trees" / head / "harness" / "run.py").is_file()
    assert capsys.readouterr().out.strip().endswith(f"elsewhere, --base {head}")
    assert not (tmp_path / "ab").exists()


def _exit_code(argv: list[str]) -> int:
    """ab.main's exit code, also where a parser ends the program itself (SystemExit)."""
    try:
        return ab.main(argv)
    except SystemExit as exc:
        return int(exc.code)


@needs_git
@pytest.mark.parametrize(("own", "run", "says"), [
    (["--base", "no-such-ref"], CELL, "--base no-such-ref: names no commit"),
    (["--base", "HEAD"], ["--model", "nope"], "argument --model: unknown model 'nope'"),
    (["--base", "HEAD"], [*CELL, "--out", "x.json"], "RUN_ARGS: --out is set by harness.ab"),
    (["--base", "HEAD", "--model", "tiny"], [], "harness.run's options go after --"),
    ([], CELL, "the two sides would run the same: give --base REF"),
    (["--env-a", "XLA_FLAGS=x", "--env-b", "XLA_FLAGS=x"], CELL, "the two sides would run the same"),
    (["--env-b", "XLA_FLAGS"], CELL, "--env-b 'XLA_FLAGS': give NAME=VALUE"),
    (["--env-a", "FOO=1"], CELL, "the run documents record only the settings named XLA_*"),
    (["--unpack-only"], [], "--unpack-only unpacks --base's tree: give --base REF"),
])
def test_bad_input_is_one_line_before_any_run(tmp_path, capsys, own, run, says) -> None:
    out = tmp_path / "ab"
    assert _exit_code([*own, "--out", str(out), "--", *run]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.slow
@needs_git
def test_a_commit_against_the_working_tree(tmp_path, capsys) -> None:
    out = tmp_path / "ab"
    argv = ["--base", "HEAD", "--runs", "1", "--out", str(out), "--", *CELL]
    assert ab.main(argv) == 0
    a = json.loads((out / "runs" / "a-1.json").read_text())
    head = _head()
    # A ran from the commit's own tree: its document names the commit and digests exactly its files.
    assert a["env"]["git_commit"] == head and a["env"]["source_sha256"] == commit_digest(head)
    assert json.loads((out / "runs" / "b-1.json").read_text())["status"] == "ok"
    answer = capsys.readouterr().out
    assert answer.startswith("the answer:") and "B (b-1) takes" in answer
    diff = json.loads((out / "diff.json").read_text())
    assert (diff["a_label"], diff["b_label"]) == ("a-1", "b-1") and diff["changes"] is not None
    # Given again, every run is kept and only the diff is written anew.
    assert ab.main(argv) == 0
    assert capsys.readouterr().err.count("kept (its document is there)") == 2


def test_a_side_s_out_names_no_folder_of_the_machine_inside_the_repository(tmp_path) -> None:
    """A run's --out inside the repository is its path from the run's folder (the working tree's
    root for B, a base tree under .ab-trees for A), which resolves there to the document; outside
    the repository it stays absolute."""
    doc = runs.ROOT / "ab" / "x" / "runs" / "b-1.json"
    assert runs.out_argument(doc, runs.ROOT) == os.path.join("ab", "x", "runs", "b-1.json")
    tree = runs.TREES / ("0" * 40)
    got = runs.out_argument(doc, tree)
    assert not os.path.isabs(got) and (tree / got).resolve() == doc.resolve()
    assert runs.out_argument(tmp_path / "b-1.json", runs.ROOT) == str((tmp_path / "b-1.json").resolve())


@pytest.mark.slow
@needs_git
def test_a_stopped_ab_keeps_its_runs_and_goes_on(tmp_path, capsys) -> None:
    out = tmp_path / "ab"
    argv = ["--base", "HEAD", "--runs", "2", "--out", str(out), "--", *CELL]
    proc = subprocess.Popen([sys.executable, "-m", "harness.ab", *argv], cwd=ROOT, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    first = out / "runs" / "a-1.json"
    deadline = time.monotonic() + 120
    while not runs.finished(first) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: stopped by SIGTERM: ") and "give the same command again to go on" in line
    kept = sorted(p.name for p in (out / "runs").glob("*.json") if runs.finished(p))
    assert "a-1.json" in kept
    assert ab.main(argv) == 0
    assert capsys.readouterr().err.count("kept (its document is there)") == len(kept)
    assert all(runs.finished(out / "runs" / f"{n}.json") for n in runs.order(2))


@pytest.mark.slow
def test_a_setting_against_none_on_the_working_tree(tmp_path, capsys) -> None:
    """No --base: both sides run the working tree, B with a setting, and the diff names it as
    what the sides differ in."""
    out = tmp_path / "ab"
    assert ab.main(["--env-b", "TORCHINDUCTOR_FX_GRAPH_CACHE=0", "--runs", "1", "--out", str(out), "--", *CELL]) == 0
    a, b = (json.loads((out / "runs" / f"{side}-1.json").read_text()) for side in "ab")
    assert a["env"]["source_sha256"] == b["env"]["source_sha256"] == source_digest()
    assert "TORCHINDUCTOR_FX_GRAPH_CACHE" not in (a["env"].get("settings") or {})
    assert b["env"]["settings"]["TORCHINDUCTOR_FX_GRAPH_CACHE"] == "0"
    changes = json.loads((out / "diff.json").read_text())["changes"]
    assert {"what": "TORCHINDUCTOR_FX_GRAPH_CACHE", "a": "unset", "b": "0"} in changes
    assert "TORCHINDUCTOR_FX_GRAPH_CACHE unset -> 0" in capsys.readouterr().out
