"""Which tree produced a result: the commit, and a digest of the source that ran.

A commit alone can drift from what ran: the checkout may carry uncommitted changes
("-dirty" says there were some, not which), and code run from a copy of the tree has no
git metadata of its own, or stale metadata. So every run document also records
`source_sha256`, a digest of the shipped source itself (the packages' ``.py`` files and
pyproject.toml, each as its path and bytes, in path order). The same digest computed from a
commit's files (`commit_digest`) says whether a document came from exactly that commit;
where the tree was dirty, `dirty_files` names the changed files and `diff_sha256` digests
`git diff HEAD`, so two runs of the same uncommitted change can still be told apart.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("harness", "torch_impl", "jax_impl", "pallas_kernels")
EXTRA = ("pyproject.toml",)


def _shipped(path: str) -> bool:
    """Whether a repository-relative path is part of the digest."""
    return path in EXTRA or (path.endswith(".py") and path.split("/", 1)[0] in PACKAGES)


def _digest(files: list[tuple[str, bytes]]) -> str:
    h = hashlib.sha256()
    for path, data in sorted(files):
        h.update(f"{path}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def source_digest(root: Path = ROOT) -> str:
    """The digest of the source under `root` as it is on disk (no git needed)."""
    files = []
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            if "__pycache__" not in path.parts:
                files.append((path.relative_to(root).as_posix(), path.read_bytes()))
    files += [(name, (root / name).read_bytes()) for name in EXTRA if (root / name).is_file()]
    return _digest(files)


def _git(root: Path, *args: str, text: bool = True) -> str | bytes:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=text, timeout=20, check=True).stdout


def commit_digest(commit: str, root: Path = ROOT) -> str:
    """The digest `source_digest` gives for the tree of `commit` (read from git)."""
    listing = _git(root, "ls-tree", "-r", "-z", commit)
    blobs = {}
    for entry in filter(None, listing.split("\0")):
        meta, path = entry.split("\t", 1)
        if _shipped(path) and meta.split()[1] == "blob":
            blobs[path] = meta.split()[2]
    out = subprocess.run(["git", "cat-file", "--batch"], cwd=root, input="\n".join(blobs.values()).encode() + b"\n",
                         capture_output=True, timeout=60, check=True).stdout
    files, at = [], 0
    for path in blobs:  # each object: "<sha> blob <size>\n<bytes>\n", in the order asked
        header_end = out.index(b"\n", at)
        size = int(out[at:header_end].split()[2])
        files.append((path, out[header_end + 1:header_end + 1 + size]))
        at = header_end + 1 + size + 1
    return _digest(files)


def tree_record(root: Path = ROOT) -> dict[str, object]:
    """`git_commit` ($XFPROF_GIT_COMMIT when set, for a copy whose git metadata need not
    match its code; else HEAD, "-dirty" with uncommitted changes; None without git),
    `source_sha256`, and for a dirty checkout `dirty_files` and `diff_sha256`."""
    record: dict[str, object] = {"git_commit": None, "source_sha256": source_digest(root)}
    if os.environ.get("XFPROF_GIT_COMMIT"):
        record["git_commit"] = os.environ["XFPROF_GIT_COMMIT"]
        return record
    try:
        head = _git(root, "rev-parse", "HEAD").strip()
        status = _git(root, "status", "--porcelain").splitlines()
        untracked = [line[3:] for line in status if line.startswith("??") and _shipped(line[3:])]
        dirty = [line[3:] for line in status if not line.startswith("??")] + untracked
        record["git_commit"] = head + ("-dirty" if dirty else "")
        if dirty:  # tracked changes as git diff shows them, new source files by their content
            h = hashlib.sha256(_git(root, "diff", "HEAD", text=False))
            for path in sorted(untracked):
                h.update(f"{path}\0".encode() + (root / path).read_bytes())
            record["dirty_files"] = dirty
            record["diff_sha256"] = h.hexdigest()
    except (OSError, subprocess.SubprocessError):
        pass
    return record
