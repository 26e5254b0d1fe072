"""The processes of `harness.ab`: the base commit's tree unpacked from git, and `harness.run`
of one cell from it (A) and from the working tree (B), or from the working tree on both sides,
each side with its own environment settings, in turns, each run's document kept where it
completed, so that an A/B stopped part way goes on where it stopped."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable, Sequence
from pathlib import Path

from harness import child_process
from harness.common.provenance import EXTRA, PACKAGES, ROOT, source_digest

TREES = ROOT / ".ab-trees"  # the base commits' trees, one folder each, unpacked once (git-ignored)


def resolve_base(ref: str) -> str:
    """The full commit `ref` names; ValueError (one line naming --base) if it names none here.
    A full commit whose tree is already unpacked needs no git: a copy of the working tree
    carried to another machine, with `.ab-trees/` and without the history, runs it as it is."""
    if re.fullmatch(r"[0-9a-f]{40}", ref) and (TREES / ref).is_dir():
        return ref
    try:
        out = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], cwd=ROOT,
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ValueError(f"--base {ref}: git could not be run here ({exc}); harness.ab needs a git checkout") from None
    if out.returncode != 0 or not out.stdout.strip():
        raise ValueError(f"--base {ref}: names no commit of the repository at {ROOT}; give a commit, branch or tag "
                         "(git log --oneline lists them)")
    return out.stdout.strip()


def unpack_tree(commit: str, trees: Path | None = None) -> Path:
    """The shipped files of `commit`, unpacked once into `trees`/<commit> (TREES by default):
    into a folder of this process's own, then renamed into place whole, so that A/Bs started at
    once never run from a half-written tree."""
    tree = (TREES if trees is None else trees) / commit
    if tree.is_dir():
        return tree
    archive = subprocess.run(["git", "archive", "--format=tar", commit, *PACKAGES, *EXTRA], cwd=ROOT,
                             capture_output=True, timeout=120, check=True).stdout
    partial = tree.parent / f".{commit}.{os.getpid()}"
    partial.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        try:
            tar.extractall(partial, filter="data")
        except TypeError:  # Python before 3.11.4 has no filter; the archive is git's own
            tar.extractall(partial)  # noqa: S202
    try:
        partial.rename(tree)
    except OSError:  # another process put the same tree in place first
        shutil.rmtree(partial, ignore_errors=True)
    return tree


def order(runs: int) -> list[str]:
    """The names of the runs in the order they go: a-1 b-1 b-2 a-2 a-3 b-3 ..."""
    names = []
    for i in range(1, runs + 1):
        names += [f"a-{i}", f"b-{i}"] if i % 2 else [f"b-{i}", f"a-{i}"]
    return names


def finished(doc_path: Path) -> bool:
    """Whether a run's document is there and says the run completed."""
    try:
        return json.loads(doc_path.read_text()).get("status") == "ok"
    except (OSError, ValueError, AttributeError):
        return False


def parse_setting(option: str, text: str) -> tuple[str, str]:
    """(NAME, VALUE) of `--env-a`/`--env-b NAME=VALUE`; ValueError (one line naming the option)
    for a malformed one, or a NAME the run documents do not record (`results.settings`), which
    the diff could then not tell apart."""
    from harness.common.results import SETTINGS_PREFIXES

    name, sep, value = text.partition("=")
    if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"{option} {text!r}: give NAME=VALUE, "
                         f"e.g. {option} XLA_FLAGS=--xla_gpu_enable_triton_gemm=false")
    if not name.startswith(SETTINGS_PREFIXES):
        named = ", ".join(p + "*" if p.endswith("_") else p for p in SETTINGS_PREFIXES)
        raise ValueError(f"{option} {text!r}: the run documents record only the settings named {named}, "
                         f"so the diff could not tell the sides apart by {name}")
    return name, value


def side_env(settings: dict[str, str]) -> dict[str, str]:
    """This process's environment with one side's settings: each NAME set to its VALUE (in
    place of this process's own), or removed where the VALUE is empty."""
    env = dict(os.environ)
    for name, value in settings.items():
        if value:
            env[name] = value
        else:
            env.pop(name, None)
    return env


def out_argument(doc: Path, cwd: Path) -> str:
    """The --out a side's `harness.run` is given for `doc`: its path from the run's folder `cwd`
    where both lie in the repository, so that the command its document records names no folder
    of this machine; the absolute path where an A/B writes outside the repository."""
    doc, cwd, root = doc.resolve(), cwd.resolve(), ROOT.resolve()
    if doc.is_relative_to(root) and cwd.is_relative_to(root):
        return os.path.relpath(doc, cwd)
    return str(doc)


def run_one(name: str, run_args: Sequence[str], out: Path, base: tuple[str, Path] | None, timeout: int | None,
            settings: dict[str, str] | None = None) -> str | None:
    """`harness.run` of one side into runs/<name>.json, A from `base`'s tree (the working tree
    where there is none), with `settings` in its environment (`side_env`); None once it
    completed, else why not."""
    from_base = base is not None and name.startswith("a-")
    cwd = base[1] if from_base else ROOT
    env = side_env(settings or {})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(cwd), env.get("PYTHONPATH")]))
    if from_base:
        env["XFPROF_GIT_COMMIT"] = base[0]
    doc = out / "runs" / f"{name}.json"
    doc.unlink(missing_ok=True)  # an earlier attempt's document of a failed or stopped run
    cmd = [sys.executable, "-m", "harness.run", *run_args, "--out", out_argument(doc, cwd)]
    with open(out / "logs" / f"{name}.log", "w") as log, \
            child_process(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT) as proc:
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()
            proc.wait()
            return f"{name} ran past --timeout {timeout} s and was stopped"
    if code == 0 and finished(doc):
        return None
    error = None
    with contextlib.suppress(OSError, ValueError, AttributeError):
        error = json.loads(doc.read_text()).get("error")
    return f"{name} failed (exit {code}){f': {error}' if error else ''}; its log: {out / 'logs' / f'{name}.log'}"


def finished_count(out: Path, runs: int) -> int:
    return sum(finished(out / "runs" / f"{name}.json") for name in order(runs))


def kept_mismatch(doc: dict, name: str, run_args: Sequence[str], base: str | None,
                  settings: dict[str, dict[str, str]], working_digest: str) -> str | None:
    """How a finished run's document differs from what this A/B would run as `name`: other
    harness.run options, another tree, or other values of the settings either side sets; None
    where it matches, so that giving the command again after an edit or with other options
    never mixes runs of two configurations into one side."""
    from harness.common.results import command_line

    env, side = doc.get("env") or {}, name[0]
    ran = str(env.get("command", "")).rsplit(" --out ", 1)[0]
    wanted = command_line(["python", "-m", "harness.run", *run_args])
    if ran != wanted:
        return f"was run as `{ran}`, where this A/B runs `{wanted}`"
    if side == "a" and base is not None:
        if env.get("git_commit") != base:
            return f"ran commit {str(env.get('git_commit'))[:7]}, where this A/B's --base is {base[:7]}"
    elif env.get("source_sha256") != working_digest:
        return (f"ran source {str(env.get('source_sha256'))[:7]}, where the working tree is now "
                f"{working_digest[:7]}")
    recorded = env.get("settings") or {}
    for setting in sorted({k for each in settings.values() for k in each}):
        want = settings.get(side, {}).get(setting, os.environ.get(setting)) or None
        if recorded.get(setting) != want:
            return (f"ran with {setting}={recorded.get(setting) or '(unset)'}, where this A/B runs {side.upper()} "
                    f"with {setting}={want or '(unset)'}")
    return None


def kept_problem(base: str | None, run_args: Sequence[str], out: Path, runs: int,
                 settings: dict[str, dict[str, str]]) -> str | None:
    """The line refusing the first finished run in `out` that `kept_mismatch` finds differing
    from this A/B (`base`: its --base commit, None without one), or None: checked with the
    A/B's input, before any run."""
    digest = source_digest()
    for name in order(runs):
        doc = out / "runs" / f"{name}.json"
        if finished(doc) and (why := kept_mismatch(json.loads(doc.read_text()), name, run_args, base, settings,
                                                   digest)):
            return f"{doc} {why}: give another --out, or remove the runs of the earlier A/B to run them again"
    return None


def describe_side(side: str, base: tuple[str, Path] | None, settings: dict[str, str]) -> str:
    """What one side runs, for the progress lines: its tree and its own settings."""
    tree = f"A {base[0][:7]}" if side == "a" and base is not None else f"{side.upper()} the working tree"
    return tree + "".join(f", {k}={v}" if v else f", {k} unset" for k, v in settings.items())


def run_sides(base: tuple[str, Path] | None, run_args: Sequence[str], out: Path, runs: int, timeout: int | None,
              progress: Callable[[str], None], settings: dict[str, dict[str, str]] | None = None) -> str | None:
    """Every run of `order(runs)` not yet finished, in turn: None once all are, else the first
    failure's line. `settings`: each side's own environment settings ({"a": {...}, "b": {...}}).
    Ctrl-C and the stop signals end it (KeyboardInterrupt) with the running child stopped and
    the finished runs' documents in place."""
    settings = settings or {}
    for sub in ("runs", "logs"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    names = order(runs)
    for k, name in enumerate(names, 1):
        if finished(out / "runs" / f"{name}.json"):
            progress(f"[{k}/{len(names)}] {name}: kept (its document is there)")
            continue
        side = settings.get(name[0], {})
        progress(f"[{k}/{len(names)}] {name}: {describe_side(name[0], base, side)}")
        if problem := run_one(name, run_args, out, base, timeout, side):
            return problem
    return None
