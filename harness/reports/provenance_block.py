"""The provenance line of a results folder's README, rendered from the run documents it holds:
the devices, framework versions, trees (`git_commit`) and commands the documents record, and in
words where a tree is "-dirty" or where the README's prose names a commit no document records.

    <!-- generated: provenance -->
    ...rendered by `python -m harness.regenerate` from the folder's *.json and *.jsonl...
    <!-- end generated -->

Nothing is typed: a README that says which tree ran is checked against what its documents say.
A commit the prose names that no document records as its tree is looked up in git: where its
source digest (`harness.common.provenance.commit_digest`) is the `source_sha256` documents
recorded, the paragraph says which documents ran exactly that commit's code (a copy of the
tree whose git metadata lagged behind it records an older commit, "-dirty").
"""

from __future__ import annotations

import functools
import json
import re
import shlex
import subprocess
from collections import Counter
from pathlib import Path

from harness import backends
from harness.common.provenance import commit_digest

ENV_KEYS = ("env", "environment")
OTHER_LIBS = ("triton",)  # beside the backends' libraries (`backends.libraries`): the attention tools' kernels
HEX = re.compile(r"`([0-9a-f]{7,40})`")
SHOWN_COMMANDS = 4  # distinct commands spelled out; the rest counted
DROPPED_OPTIONS = ("--out", "--compile-cache", "--keep-profiles")  # folders of the machine a run wrote to


def _documents(folder: Path) -> list[tuple[Path, dict]]:
    """Every JSON document under `folder` (each line of a .jsonl), by path; what cannot be read is none."""
    docs = []
    for path in sorted([*folder.rglob("*.json"), *folder.rglob("*.jsonl")]):
        try:
            with open(path) as f:
                found = [json.loads(line) for line in f if line.strip()] if path.suffix == ".jsonl" else [json.load(f)]
        except (OSError, ValueError):
            continue
        docs += [(path, doc) for doc in found if isinstance(doc, dict)]
    return docs


def _envs(doc: object, depth: int = 0) -> list[dict]:
    """The environment records of a document, its own first, then those of its runs and parts."""
    if depth > 4 or not isinstance(doc, dict):
        return []
    own = [doc[k] for k in ENV_KEYS if isinstance(doc.get(k), dict)] or _flat(doc, depth)
    for key, value in doc.items():
        if key in ENV_KEYS:
            continue
        for sub in value.values() if isinstance(value, dict) and key == "runs" else [value]:
            own += _envs(sub, depth + 1)
    return own


def _flat(doc: dict, depth: int) -> list[dict]:
    """A document that records its command and commit at its top (`harness.bench_ranks`) as
    its environment record."""
    commit = doc.get("git_commit") or doc.get("commit")
    return [{"git_commit": commit, "command": doc["command"]}] if depth == 0 and commit and doc.get("command") else []


def command(text: str) -> str:
    """A recorded command without the folders it wrote to (`--out`, `--compile-cache`,
    `--keep-profiles`) and with the machine's absolute paths as PATH."""
    try:
        words = shlex.split(text)
    except ValueError:
        words = text.split()
    kept = [w for i, w in enumerate(words)
            if w not in DROPPED_OPTIONS and (i == 0 or words[i - 1] not in DROPPED_OPTIONS)]
    return " ".join("PATH" if w.startswith("/") else w for w in kept)


def tree_label(commit: str) -> str:
    """A recorded commit as the short hash git prints, with "-dirty" kept."""
    base, dirty, _ = commit.partition("-dirty")
    return base[:7] + ("-dirty" if dirty else "")


def _counted(counter: Counter) -> str:
    return ", ".join(f"{k} ({n})" if len(counter) > 1 else k for k, n in counter.most_common())


def provenance(folder: Path, prose: str) -> str:
    """The provenance paragraph of `folder`'s documents; `prose` is the README's text outside its
    generated blocks, whose backquoted commits are set against the recorded ones."""
    docs = _documents(folder)
    envs = [(path, env) for path, doc in docs for env in _envs(doc)]
    if not envs:
        return "No document here records its environment.\n"
    devices = Counter(str(e.get("gpu_name") or e["device"]) for _, e in envs if e.get("gpu_name") or e.get("device"))
    versions = {lib: sorted({str(e[lib]) for _, e in envs if e.get(lib)})
                for lib in (*backends.libraries(), *OTHER_LIBS)}
    trees = Counter(tree_label(str(e["git_commit"])) for _, e in envs if e.get("git_commit"))
    commands = Counter(command(str(env["command"])) for _, doc in docs for env in _envs(doc)[:1]
                       if env.get("command"))
    n_docs = len({id(doc) for _, doc in docs if _envs(doc)})
    parts = [f"device {_counted(devices) or 'not recorded'}",
             *(f"{lib} {', '.join(v)}" for lib, v in versions.items() if v),
             f"tree {_counted(trees) or 'not recorded'}"]
    lines = [f"From the {n_docs} document{'s' if n_docs > 1 else ''} here (environment records, counted): "
             + "; ".join(parts) + "."]
    shown = [f"`{c}`" for c, _ in commands.most_common(SHOWN_COMMANDS)]
    if shown:
        rest = len(commands) - len(shown)
        lines.append(f"Commands: {'; '.join(shown)}" + (f"; and {rest} more, each in its document's environment."
                                                          if rest else "."))
    recorded = {t.removesuffix("-dirty") for t in trees}
    unrecorded = [n for n in sorted(set(HEX.findall(prose)))
                  if not any(n.startswith(t) or t.startswith(n) for t in recorded)]
    sources = {n: _ran(n, envs) for n in unrecorded}
    explained = {id(e) for matched in sources.values() for e in matched}
    for tree in sorted(t for t in trees if t.endswith("-dirty")):
        of_tree = [e for _, e in envs if tree_label(str(e.get("git_commit"))) == tree]
        if all(id(e) in explained for e in of_tree):
            continue
        files = sorted({str(f) for e in of_tree for f in e.get("dirty_files") or ()})
        changes = (f"uncommitted changes to {', '.join(f'`{f}`' for f in files)}." if files else
                   "the tree had uncommitted changes, which the documents do not name.")
        lines.append(f"The runs record `{tree}`: {changes}")
    for named in unrecorded:
        ran = Counter(f"`{tree_label(str(e.get('git_commit')))}`" for e in sources[named])
        if ran:
            n = sum(ran.values())
            lines.append(f"The text above names `{named}`: the source of {n} environment record{'s' if n > 1 else ''} "
                         f"here, recorded as {_counted(ran)}, is its tree's (their `source_sha256`).")
        else:
            lines.append(f"The text above names `{named}`, which no document here records as its tree.")
    return "\n".join(lines) + "\n"


def _ran(commit: str, envs: list[tuple[Path, dict]]) -> list[dict]:
    """The environment records whose `source_sha256` is `commit`'s source digest (none where git
    does not know the commit)."""
    digest = _digest_of(commit)
    return [e for _, e in envs if digest and e.get("source_sha256") == digest]


@functools.cache
def _digest_of(commit: str) -> str | None:
    """`commit_digest`, once per commit however many pages name it; None where git cannot tell."""
    try:
        return commit_digest(commit)
    except (OSError, subprocess.SubprocessError):
        return None
