"""Profiles of several ranks, read as one `RankSet`: a profile holding several processes
(``nsys profile torchrun ...``: the launcher and its children on one clock), or one file
per rank (nsys reports or torch.profiler traces, named ``X.rank0...`` or in one folder).

Each rank is one process: its kernels (by the process that launched them) and its own
ranges; ranges are never matched across processes. Where a rank number comes from, first
found wins: the rank torch.distributed recorded in the trace (Kineto's ``distributedInfo``);
a rank number in the file name; the order of the processes (process id) or of the files.
The set says which it used. A set whose files disagree on the GPU, the world size, the
profiler or the job name, or whose rank numbers leave a gap between its lowest and highest,
is refused in one line (one rank's file alone, or ranks 4..7 of a job, is a set).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from harness.common.documents import COMPARE_SCHEMA, family
from harness.common.results import compare_folder_problem
from harness.trace.profile import PROCESS_SHIFT, UNKNOWN, Profile, ProfileError

RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
PROFILE_NAME = re.compile(r"\.(?:json|sqlite)(?:\.gz)?$|\.nsys-rep$")


@dataclass
class RankSet:
    """The profiles of one job's ranks, by rank, and how the ranks were numbered."""

    name: str
    profiles: dict[int, Profile]
    rank_source: str  # in words: "torch.distributed's rank recorded in each trace", ...


def job_name(path: str | Path) -> str:
    """A file's name without its rank and profile suffixes: the same for every rank of a job."""
    name = PROFILE_NAME.sub("", Path(path).name.removesuffix(".pt.trace.json.gz").removesuffix(".pt.trace.json"))
    return RANK_IN_NAME.sub("rank", name)


def rank_in_name(path: str | Path) -> int | None:
    found = RANK_IN_NAME.findall(Path(path).name)
    return int(found[-1]) if found else None


def profile_files(folder: Path) -> list[Path]:
    """The profiles directly in `folder` (nsys reports and exports, torch.profiler traces);
    a `harness.compare` result folder is refused, in one line saying what it is."""
    summary = folder / "summary.json"
    if summary.is_file() and f'"{family(COMPARE_SCHEMA)}'.encode() in summary.read_bytes()[:4096]:
        raise ProfileError(compare_folder_problem(folder))
    files = sorted(p for p in folder.iterdir() if p.is_file() and PROFILE_NAME.search(p.name))
    exported = {p.name.split(".sqlite")[0] for p in files if ".sqlite" in p.name}
    # an .nsys-rep and its export are one profile: keep the export
    files = [p for p in files if p.name.removesuffix(".nsys-rep") not in exported]
    if not files:
        raise ProfileError(f"{folder}: a folder without profiles (.nsys-rep, .sqlite[.gz], torch.profiler "
                           ".json[.gz]); pass the per-rank files of one job, or their folder")
    return files


def split_processes(profile: Profile) -> RankSet | None:
    """The ranks of a profile holding several processes with GPU work (None: one process).
    Ranks follow the process ids: nsys keeps no environment, so RANK is not known."""
    kt = profile.kernels
    pids = np.unique(kt.process[kt.process != UNKNOWN])
    if len(pids) < 2:
        return None
    out = {}
    for rank, pid in enumerate(pids.tolist()):
        ranges = [r for r in profile.ranges if r.thread is not None and r.thread >> PROCESS_SHIFT == pid]
        out[rank] = replace(profile, label=f"{profile.label} rank{rank}", kernels=kt.take(kt.process == pid),
                            ranges=ranges, api=[], rank=rank,
                            notes=[*profile.notes, "the CUDA API summary covers every process of the profile: "
                                   "left out of the per-rank columns"])
    return RankSet(profile.label, out, f"process order ({len(pids)} processes with GPU work, numbered by "
                                      "process id: nsys records no RANK or LOCAL_RANK)")


def rank_set(paths: list[Path], profiles: list[Profile]) -> RankSet:
    """The per-rank files `paths` (loaded as `profiles`) as one job's ranks, checked."""
    for attr, what in (("source", "profiler"), ("gpu", "GPU"), ("world_size", "world size")):
        seen = {getattr(p, attr) for p in profiles} - {None}
        if len(seen) > 1:
            raise ProfileError(f"{paths[0].parent}: the files mix profiles of different jobs ({what}: "
                               f"{', '.join(sorted(map(str, seen)))}); pass one job's per-rank files")
    jobs = {job_name(p) for p in paths}
    if len(jobs) > 1:
        raise ProfileError(f"{paths[0].parent}: the files mix profiles of different jobs ({', '.join(sorted(jobs))}); "
                           "pass one job's per-rank files")
    if all(p.rank is not None for p in profiles):
        ranks, source = [p.rank for p in profiles], "torch.distributed's rank, recorded in each trace"
    elif all(rank_in_name(p) is not None for p in paths):
        ranks, source = [rank_in_name(p) for p in paths], "the rank number in each file name"
    else:
        ranks, source = list(range(len(paths))), "file order (no rank recorded in the traces or their names)"
    by_rank: dict[int, Profile] = {}
    for rank, path, profile in zip(ranks, paths, profiles):
        if rank in by_rank:
            raise ProfileError(f"{path}: a second profile of rank {rank} (also {by_rank[rank].path}): the files mix "
                               "runs; pass one run's per-rank files")
        by_rank[rank] = replace(profile, label=f"rank{rank}", rank=rank)
    gaps = sorted(set(range(min(by_rank), max(by_rank) + 1)) - set(by_rank))  # a set may start past rank 0
    if gaps:
        raise ProfileError(f"{paths[0].parent}: rank file missing from the set: rank {', '.join(map(str, gaps))} "
                           f"of ranks {min(by_rank)}..{max(by_rank)}; add it, or pass only ranks without a gap")
    world = profiles[0].world_size
    if world and world > len(by_rank):
        source += f"; {len(by_rank)} of the job's {world} ranks"
    return RankSet(next(iter(jobs)), dict(sorted(by_rank.items())), source)
