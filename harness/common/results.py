"""Result folders and what produced a result: atomic JSON, folder checks, the environment stamp."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path


def ensure_dir(path: str | os.PathLike, option: str = "--out") -> Path:
    """Create folder `path` (and its parents); a file in its place is refused with a
    ValueError that names `option`."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{option} {path}: is a file; name a folder")
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_json(path: str | os.PathLike, doc: object) -> None:
    """Write `doc` as JSON atomically (a reader never sees half a file), creating the folder."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


def git_commit() -> str | None:
    """$XFPROF_GIT_COMMIT when set (for code run from a copy of the tree, whose .git
    folder, if any, need not match the code), else HEAD of the checkout with -dirty for
    uncommitted changes, else None."""
    if os.environ.get("XFPROF_GIT_COMMIT"):
        return os.environ["XFPROF_GIT_COMMIT"]
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain",
             "--untracked-files=no"], cwd=here, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        return out + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def command_line() -> str:
    """How this process was started, with temporary paths reduced to their file names."""
    tmp = tempfile.gettempdir()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep

    def clean(arg: str) -> str:
        if arg.startswith(root):
            return arg[len(root):]  # a file of this project, relative to its root
        if arg.startswith(tmp) or arg.startswith(os.path.expanduser("~")):
            return os.path.basename(arg)
        return arg

    args = [clean(a) for a in sys.orig_argv[1:]]
    return " ".join(["python", *args])


# nvidia-smi fields recorded with every result. A GPU held at its power limit
# under sustained load clocks down (an H100 at 700 W ran 1560-1875 MHz instead of
# 1980), so the limit and the clock ceiling say whether two machines compare.
NVIDIA_SMI_FIELDS = {"name": "gpu_name", "driver_version": "driver", "power.limit": "gpu_power_limit",
                     "clocks.max.sm": "gpu_max_sm_clock"}


def parse_nvidia_smi(text: str) -> dict[str, str]:
    """The first GPU's line of `nvidia-smi --query-gpu=<NVIDIA_SMI_FIELDS> --format=csv,noheader`,
    keyed by our names; fields nvidia-smi cannot read ("[N/A]") are left out."""
    lines = text.strip().splitlines()
    if not lines:
        return {}
    values = [part.strip() for part in lines[0].split(",")]
    return {key: value for key, value in zip(NVIDIA_SMI_FIELDS.values(), values)
            if value and not value.startswith("[")}


def nvidia_smi() -> dict[str, str]:
    """GPU name, driver, power limit and maximum SM clock as nvidia-smi reports
    them (empty without a GPU)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(NVIDIA_SMI_FIELDS)}", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return parse_nvidia_smi(out)


def environment(extra: dict | None = None) -> dict:
    """What produced a number: host, Python, git commit, command line, plus `extra`."""
    env = {
        "host_platform": platform.platform(),
        "python": platform.python_version(),
        "git_commit": git_commit(),
        "command": command_line(),
        **nvidia_smi(),
    }
    env.update(extra or {})
    return env


def gpu_slug(name: str | None) -> str:
    """A short file-name-safe device name: 'NVIDIA H100 80GB HBM3' -> 'h100-80gb-hbm3'."""
    if not name:
        return "cpu"
    slug = name.lower().replace("nvidia", "").strip()
    return "-".join("".join(c if c.isalnum() else " " for c in slug).split())
