"""Result folders and what produced a result: atomic JSON, folder checks, the environment stamp."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from harness.common.documents import COMPARE_SCHEMA, RUN_SCHEMA, is_document, schema_of


def ensure_dir(path: str | os.PathLike, option: str = "--out") -> Path:
    """Create folder `path` (and its parents); a file in its place is refused with a
    ValueError that names `option`."""
    problem = dir_problem(path, option)
    if problem:
        raise ValueError(problem)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _first_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def dir_problem(path: str | os.PathLike, option: str = "--out", named: str | os.PathLike | None = None) -> str | None:
    """Why folder `path` cannot be created or written (a one-line message naming `option`,
    the path as given, or `named` when that is what the user gave, and the fix), or None when
    it can. Checked before a long job, which would otherwise lose its results at the end."""
    shown = named or path
    path = Path(os.path.abspath(path))
    if path.exists() and not path.is_dir():
        return f"{option} {shown}: is a file; name a folder"
    existing = _first_existing(path)
    if not existing.is_dir():
        return f"{option} {shown}: {existing} is a file, so no folder can be made below it; name another folder"
    try:  # a real write: permission bits alone say nothing for root, /proc or a read-only mount
        fd, probe = tempfile.mkstemp(prefix=".write-check-", dir=existing)
        os.close(fd)
        os.remove(probe)
    except OSError as exc:
        return f"{option} {shown}: cannot write in {existing} ({exc.strerror or exc}); name a folder you can write to"
    return None


def file_problem(path: str | os.PathLike, option: str = "--out") -> str | None:
    """Why file `path` cannot be written (one line naming `option` and the fix), or None."""
    full = Path(os.path.abspath(path))
    if full.is_dir():
        return f"{option} {path}: is a folder; name a file in it, e.g. {full / 'result.json'}"
    return dir_problem(full.parent, option, named=path)


def new_file_problem(path: str | os.PathLike, option: str = "--out", overwrite: bool = False) -> str | None:
    """`file_problem`, and an existing file refused unless `overwrite` (the flag that allows
    it is `--overwrite`): a finished result is never replaced by accident."""
    if problem := file_problem(path, option):
        return problem
    if not overwrite and os.path.exists(path):
        return f"{option} {path}: already exists; pass --overwrite to replace it, or name another file"
    return None


def save_json(path: str | os.PathLike, doc: object, option: str = "--out") -> str | None:
    """`write_json` to `path`; should that fail after the work is done (the folder was
    removed or filled up since it was checked), the document is written to a new file in
    the temporary folder instead, so a finished result is never lost. Returns None, or the
    one line that says where the result went."""
    try:
        write_json(path, doc)
        return None
    except OSError as exc:
        fd, kept = tempfile.mkstemp(prefix=f"{Path(path).stem}-", suffix=".json")
        os.close(fd)
        write_json(kept, doc)
        return f"{option} {path}: could not write it ({exc.strerror or exc}); the result is kept in {kept}"


def make_dir_tmp(prefix: str, parent: str | os.PathLike) -> str:
    """A new empty folder under `parent` for building a result folder that is then renamed
    into place: `tempfile.mkdtemp` makes it private (0o700), a result folder gets the
    usual permissions (0o777 less the umask)."""
    tmp = tempfile.mkdtemp(prefix=prefix, dir=parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)
    return tmp


def write_json(path: str | os.PathLike, doc: object) -> None:
    """Write `doc` as JSON atomically (a reader never sees half a file), creating the
    folder; a failed write leaves neither half a file nor its temporary file behind."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[str]:
    """A temporary name beside `path` (same folder, same suffix, so a writer that picks the
    format by it still does) for the block to write; moved onto `path` in one step when the
    block ends, removed when it fails. A reader, a crash or a signal never finds half a file
    or an emptied one where a document was; a block that writes nothing leaves `path` as it was.
    A link, device or pipe at `path` (/dev/stdout) is written in place: a rename would replace it."""
    path = os.fspath(path)
    if os.path.islink(path) or (os.path.exists(path) and not os.path.isfile(path)):
        yield path
        return
    folder, name = os.path.split(path)
    stem, suffix = os.path.splitext(name)
    tmp = os.path.join(folder, f".{stem}.tmp{os.getpid()}{suffix}")
    try:
        yield tmp
        if os.path.exists(tmp):
            os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` atomically (`atomic_path`)."""
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        f.write(text)


class LockHeld(Exception):
    """Another process holds the lock; `holder` is its process id as it wrote it ("" if unknown)."""

    def __init__(self, holder: str):
        super().__init__(holder)
        self.holder = holder


@contextlib.contextmanager
def held_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive lock on file `path` (`fcntl.flock`, created here, holding this process's
    id) for the block, so that two processes never write the same result at once; another
    holder raises `LockHeld` at once, without waiting. The file is removed on release; the
    lock ends with the process however it ends, so a killed holder leaves no stale lock."""
    path = os.fspath(path)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            raise LockHeld(holder) from None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)  # its last holder removed it as we opened it: lock the file at `path` now
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        os.close(fd)


def git_commit() -> str | None:
    """The commit a result came from (`harness.common.provenance.tree_record`)."""
    from harness.common.provenance import tree_record

    return tree_record()["git_commit"]


def command_line(argv: list[str] | None = None) -> str:
    """How this process was started (`argv`: `sys.orig_argv`), as a command that reruns it
    from the same folder: the `xfprof` console script by its name, the interpreter as
    `python`, every argument as given (an --out path as typed, not cut to its file name),
    quoted for a POSIX shell; a path under the home folder is written `~/...`."""
    argv = list(sys.orig_argv if argv is None else argv)[1:]
    program = ["python"]
    if argv and not argv[0].startswith("-") and os.path.basename(argv[0]) == "xfprof":  # the console script
        program, argv = ["xfprof"], argv[1:]
    home = os.path.expanduser("~").rstrip(os.sep) + os.sep

    def quote(arg: str) -> str:
        if home != os.sep and arg.startswith(home):
            return "~/" + shlex.quote(arg[len(home):])
        return shlex.quote(arg)

    return " ".join([*program, *map(quote, argv)])


# nvidia-smi fields recorded with every result. A GPU held at its power limit
# under sustained load clocks down (an H100 at 700 W ran 1560-1875 MHz instead of
# 1980), so the limit and the clock ceiling say whether two machines compare. The total
# memory ("143771 MiB") is what a sweep's fit prediction compares against.
NVIDIA_SMI_FIELDS = {"name": "gpu_name", "driver_version": "driver", "power.limit": "gpu_power_limit",
                     "clocks.max.sm": "gpu_max_sm_clock", "memory.total": "gpu_memory"}


def parse_nvidia_smi(text: str) -> dict[str, str]:
    """The first GPU's line of `nvidia-smi --query-gpu=<NVIDIA_SMI_FIELDS> --format=csv,noheader`,
    keyed by our names; fields nvidia-smi cannot read ("[N/A]") are left out."""
    gpus = parse_nvidia_smi_all(text)
    return gpus[0] if gpus else {}


def parse_nvidia_smi_all(text: str) -> list[dict[str, str]]:
    """`parse_nvidia_smi` of every line: one dict per GPU, in nvidia-smi's order."""
    return [{key: value for key, value in zip(NVIDIA_SMI_FIELDS.values(), (p.strip() for p in line.split(",")))
             if value and not value.startswith("[")} for line in text.strip().splitlines() if line.strip()]


def visible_gpu_ids() -> list[str] | None:
    """The GPUs CUDA will use, as $CUDA_VISIBLE_DEVICES names them (indices or UUIDs, which
    nvidia-smi's --id takes too); None where it is not set (every GPU)."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


def nvidia_smi_all() -> list[dict[str, str]]:
    """`nvidia_smi` of every GPU this process may use ($CUDA_VISIBLE_DEVICES), in its order;
    empty without a GPU."""
    ids = visible_gpu_ids()
    if ids == []:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(NVIDIA_SMI_FIELDS)}", "--format=csv,noheader",
             *(["--id=" + ",".join(ids)] if ids else [])],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_nvidia_smi_all(out)


def nvidia_smi() -> dict[str, str]:
    """GPU name, driver, power limit and maximum SM clock as nvidia-smi reports them, of
    the first GPU this process may use (where CUDA puts device 0); empty without a GPU."""
    gpus = nvidia_smi_all()
    return gpus[0] if gpus else {}


# Environment variables that change what a run measures (compiler flags, memory pools).
SETTINGS_PREFIXES = ("XLA_", "JAX_", "TORCHINDUCTOR_", "TORCH_COMPILE", "PYTORCH_CUDA_ALLOC_CONF", "NCCL_",
                     "TORCH_NCCL_", "CUDA_DEVICE_MAX_CONNECTIONS",
                     "ENABLE_PERSISTENT_TMA_MATMUL")  # Inductor's Hopper GEMM templates under max-autotune


def settings() -> dict[str, str]:
    """The environment variables set for this process that change what it measures."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(SETTINGS_PREFIXES)}


def environment(extra: dict | None = None) -> dict:
    """What produced a number: host, Python, the tree (commit and source digest,
    `harness.common.provenance`), command line, the settings made
    through environment variables (`settings`, when any), plus `extra`."""
    from harness.common.provenance import tree_record

    env = {
        "host_platform": platform.platform(),
        "python": platform.python_version(),
        **tree_record(),
        "command": command_line(),
        **nvidia_smi(),
    }
    if variables := settings():
        env["settings"] = variables
    env.update(extra or {})
    return env


def gpu_slug(name: str | None) -> str:
    """A short file-name-safe device name: 'NVIDIA H100 80GB HBM3' -> 'h100-80gb-hbm3'."""
    if not name:
        return "cpu"
    slug = name.lower().replace("nvidia", "").strip()
    return "-".join("".join(c if c.isalnum() else " " for c in slug).split())


def not_a_profile(path: str | os.PathLike, doc: object) -> str | None:
    """Where a JSON file given as a profile is a result the harness wrote (a `harness.run`
    document, a `harness.compare` summary, a kernel breakdown), the one line saying so and
    what to give instead; None for any other JSON."""
    schema = schema_of(doc)
    if is_document(doc, RUN_SCHEMA):
        return (f"{path}: a harness.run result document, not a profile; give the profile of that run "
                "(.nsys-rep, .sqlite[.gz] or its --profile trace), with this file as --harness-json")
    if is_document(doc, COMPARE_SCHEMA):
        return compare_folder_problem(Path(path).parent)
    if isinstance(doc, list) and doc and all(isinstance(d, dict) and {"label", "phases"} <= d.keys() for d in doc):
        return (f"{path}: a kernel breakdown (kernels.json of harness.report or harness.compare), not a profile; "
                "give the profile it was made from")
    if schema.startswith("harness."):
        return f"{path}: a {schema} document of the harness, not a profile; give a profile"
    return None


def compare_folder_problem(folder: str | os.PathLike) -> str:
    """The one line for a `harness.compare` result folder given where profiles are expected."""
    return (f"{folder}: a harness.compare result folder, not a profile; its kernel breakdown is kernels.md there, "
            "and a report of its runs needs their profiles (harness.compare --keep-profiles DIR keeps them)")
