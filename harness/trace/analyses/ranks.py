"""Several ranks of one job side by side: the report's inputs grouped into rank sets, and
the cross-rank table (per-phase medians per rank, the straggler, communication per rank
with the part hidden under compute and the exposed rest, from
`harness.trace.analyses.overlap`).

Inputs (`load_inputs`): a folder of per-rank files (one job: see
`harness.trace.sources.ranks`), files named with a rank (``X.rank0.json``,
``X.rank1.json``) given together, or one profile holding several processes (``nsys
profile torchrun``) become one rank set, one column per rank; any other file is one column.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from harness.common.progress import file_size, stage
from harness.trace.analyses.answers import answers, harness_metadata, run_json_problems
from harness.trace.analyses.breakdown import Breakdown, breakdown, load_profile
from harness.trace.analyses.collectives import rank_collectives, ranks_split
from harness.trace.analyses.hlo_join import hlo_dir, load_schedules
from harness.trace.analyses.overlap import overlap, per_step_exposure
from harness.trace.analyses.registry import Context, analysis, run_analyses
from harness.trace.analyses.selection import Selection, select
from harness.trace.profile import STEP_RANGES, Profile, ProfileError
from harness.trace.sources.ranks import RankSet, job_name, profile_files, rank_in_name, rank_set, split_processes


@dataclass
class Input:
    """One column (`rank_set` None) or one job's ranks, as loaded."""

    profiles: list[Profile]
    rank_set: RankSet | None = None


def _is_jax_dir(path: Path) -> bool:
    return path.is_dir() and any(path.rglob("*.xplane.pb*"))


def _rank_group(paths: list[Path], i: int) -> list[Path]:
    """The paths from `i` on that name ranks of one job (``X.rank0``, ``X.rank1``, ...)."""
    group = [paths[i]]
    while (rank_in_name(paths[i]) is not None and i + len(group) < len(paths)
           and job_name(paths[i + len(group)]) == job_name(paths[i])
           and rank_in_name(paths[i + len(group)]) is not None):
        group.append(paths[i + len(group)])
    return group


def _items(paths: Sequence[str | Path]) -> list[list[Path] | Path]:
    """The inputs grouped: a list of one job's per-rank files (a folder's, or X.rank0/X.rank1
    given together), or one path."""
    paths = [Path(p) for p in paths]
    out: list[list[Path] | Path] = []
    i = 0
    while i < len(paths):
        path = paths[i]
        if path.is_dir() and not _is_jax_dir(path):
            out.append(profile_files(path))
            i += 1
            continue
        group = _rank_group(paths, i)
        out.append(group if len(group) > 1 else path)
        i += len(group)
    return out


def load_inputs(paths: Sequence[str | Path], labels: Sequence[str | None] = (), nsys_bin: str | None = None,
                force: bool = False) -> list[Input]:
    """The report's inputs, loaded and grouped (module docstring); the i-th label names the
    i-th path's column (a rank set's columns are its ranks). Every profile is held at once:
    `report_inputs` reads rank sets one rank at a time instead."""
    out: list[Input] = []
    for i, item in enumerate(_items(paths)):
        if isinstance(item, list):
            out.append(_set(item, nsys_bin, force))
            continue
        profile = _read(item, labels[i] if i < len(labels) else None, nsys_bin, force)
        split = split_processes(profile)
        out.append(Input(list(split.profiles.values()), split) if split else Input([profile]))
    return out


def _read(path: Path, label: str | None, nsys_bin: str | None, force: bool) -> Profile:
    """`load_profile`, saying what it reads when that takes long (`harness.common.progress`)."""
    with stage("trace", f"reading {path.name} ({file_size(path)})") as found:
        profile = load_profile(path, label, nsys_bin, force)
        found(f"{len(profile.kernels):,} GPU activities, {len(profile.ranges):,} ranges")
    return profile


def _set(files: list[Path], nsys_bin: str | None, force: bool) -> Input:
    profiles = [_read(f, None, nsys_bin, force) for f in files]
    for f, p in zip(files, profiles):
        _one_process(f, p)
    rs = rank_set(files, profiles)
    return Input(list(rs.profiles.values()), rs)


def _one_process(path: Path, profile: Profile) -> None:
    if split_processes(profile):
        raise ProfileError(f"{path}: holds several processes; pass it alone (its processes are its ranks), "
                           "not in a set of per-rank files")


@analysis("communication", "Communication per rank")
def _communication(profile: Profile, context: Context) -> dict | None:
    """A rank's `communication`, for the cross-rank table (None: not one rank of a set)."""
    return communication(profile, context.selection) if context.rank else None


@analysis("collectives", "Collectives per rank")
def _collectives(profile: Profile, context: Context) -> dict | None:
    """A rank's collectives (`rank_collectives`), for the cross-rank table's split into transfer
    and waiting; None where the column is not a rank, has no ranges or no session start (its
    clock cannot be put beside the other ranks')."""
    known = context.rank and context.selection is not None and profile.session_start_ns is not None
    return rank_collectives(profile, context.selection) if known else None


def communication(profile: Profile, sel: Selection | None) -> dict:
    """One rank's communication kernels of the measured steps (`cross_rank`)."""
    devices = overlap(profile.kernels, selected=sel) if sel else overlap(profile.kernels)
    total = sum(d["communication_ms"] for d in devices)
    hidden = sum(d["hidden_ms"] for d in devices)
    steps = sum(len(i) for name, i in sel.instances.items() if name in STEP_RANGES) if sel else 0
    return {"communication_ms": total, "hidden_ms": hidden, "exposed_ms": total - hidden,
            "hidden_share": hidden / total if total else None, "step_ranges": steps,
            "per_step": per_step_exposure({"ranks": [{"overlap": devices, "phases_ms": {}}]})}


def cross_rank(rs: RankSet, bds: Sequence[Breakdown], comms: Mapping[int, dict],
               collectives: Mapping[int, dict] | None) -> dict:
    """Per phase and rank: median GPU ms and range ms per step; per phase the straggler
    (the rank with the longest median range, and slowest/fastest); per rank the
    communication kernels of the measured steps (`comms`, per rank its `communication`: the
    first step set apart, each kernel in the step that launched it where the program
    does not synchronize), hidden and exposed (ms, summed over the steps and devices), with the
    same per step (`per_step`); and the communication split into transfer and waiting by
    aligning the ranks' collectives (`collectives`, per rank its `rank_collectives`; `split`:
    None where the ranks' clocks are not known to be one, or fewer than two ranks hold
    collectives)."""
    ranks = list(rs.profiles)
    phases: dict[str, dict[int, dict[str, float]]] = {}
    for rank, bd in zip(ranks, bds):
        for name, p in bd.phases.items():
            phases.setdefault(name, {})[rank] = {"gpu_ms": p.gpu_ns_median / 1e6, "range_ms": p.range_ns_median / 1e6,
                                                 "steps": p.steps}
    straggler = {}
    for name, per_rank in phases.items():
        if len(per_rank) == len(ranks) > 1:
            walls = {r: v["range_ms"] for r, v in per_rank.items()}
            slow, fast = max(walls, key=walls.get), min(walls, key=walls.get)
            straggler[name] = {"rank": slow, "range_ms": walls[slow], "fastest_rank": fast,
                               "ratio": walls[slow] / walls[fast] if walls[fast] else None}
    return {"name": rs.name, "rank_source": rs.rank_source, "ranks": ranks, "labels": [bd.label for bd in bds],
            "phases": phases,
            "straggler": straggler, "communication": dict(comms),
            "split": ranks_split(collectives) if collectives else None}


@dataclass
class RankFigures:
    """What the report keeps of one rank's profile (`rank_figures`): the profile itself is
    dropped, so a rank set's memory is that of its largest rank, not their sum."""

    info: RankInfo
    breakdown: Breakdown
    answers: dict
    figures: dict
    analyses: dict  # the registered analyses' results, by name (`harness.trace.analyses.registry`)
    mode: str | None  # how its kernels went to ranges (`Selection.mode`; None: no ranges)

    @property
    def communication(self) -> dict:
        return self.analyses["communication"]

    @property
    def collectives(self) -> dict | None:  # None: no ranges, or no session start to put the ranks on one clock
        return self.analyses.get("collectives")


@dataclass
class RankInfo:
    """A rank's file and what `rank_set` checks of it, without its records."""

    path: str
    label: str
    source: str
    gpu: str | None
    world_size: int | None
    rank: int | None


@dataclass
class Column:
    """One column of a report: its breakdown, answers (a)-(e), HTA's figures (with its label
    and GPU) and every registered analysis's result by name."""

    breakdown: Breakdown
    answers: dict
    figures: dict
    analyses: dict


def analyse_column(profile: Profile, sel: Selection | None, require: Sequence[str] = (),
                   attribution: str = "auto", run_json: str | Path | None = None, scope: str = "all",
                   rank: bool = False) -> Column:
    """One column's breakdown, answers, HTA figures and registered analyses (`rank`: the
    profile is one rank of a set): what the report, the comparison and the diff analyse of a
    profile. `sel`: the profile's ``select(profile, attribution)``."""
    bd, meta = _breakdown(profile, sel, require, attribution, run_json)
    return Column(bd, *_figures(profile, bd, meta, scope, sel, rank))


def _breakdown(profile: Profile, sel: Selection | None, require: Sequence[str], attribution: str,
               run_json: str | Path | None) -> tuple[Breakdown, dict]:
    """One column's breakdown and its `harness.run` metadata."""
    hlo = hlo_dir(profile.path)
    bd = breakdown(profile, require, attribution, schedules=load_schedules(hlo) if hlo.is_dir() else None,
                   selection=sel)
    meta = harness_metadata(run_json) if run_json else {}
    bd.warnings += run_json_problems(profile, bd, meta) if meta else []
    return bd, meta


def _figures(profile: Profile, bd: Breakdown, meta: dict, scope: str, sel: Selection | None,
             rank: bool = False) -> tuple[dict, dict, dict]:
    """One column's answers, HTA figures and registered analyses (`run_analyses`)."""
    results = run_analyses(profile, Context(bd, sel, meta, scope, rank))
    return (answers(bd, meta.get("forward_ms"), meta), {"label": bd.label, "gpu": profile.gpu, **results["gpu_time"]},
            results)


def rank_figures(path: Path, order: int, nsys_bin: str | None, force: bool, require: Sequence[str],
                 attribution: str, run_json: str | Path | None, scope: str, launch: bool = False) -> RankFigures:
    """One rank's file read and reduced to what the report shows (`RankFigures`); with
    `launch`, its kernels go to ranges by launch call (every rank of a set by one rule). Runs
    in a worker process."""
    profile = load_profile(path, None, nsys_bin, force)
    _one_process(path, profile)
    guess = next(r for r in (profile.rank, rank_in_name(path), order) if r is not None)
    profile = replace(profile, label=f"rank{guess}")
    sel = select(profile, attribution)
    if launch and sel is not None and sel.mode != "launch":
        sel = select(profile, "launch")
    col = analyse_column(profile, sel, require, attribution, run_json, scope, rank=True)
    return RankFigures(RankInfo(str(path), profile.label, profile.source, profile.gpu, profile.world_size,
                                profile.rank), col.breakdown, col.answers, col.figures, col.analyses,
                       sel and sel.mode)


def workers() -> int:
    """Processes that read a rank set's files: the cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _read_ranks(files: list[Path], jobs: int, nsys_bin: str | None, force: bool, require: Sequence[str],
                attribution: str, run_jsons: Sequence, scope: str, first: int) -> list[RankFigures]:
    """`rank_figures` of every file, in order, over `jobs` processes (1: in this one); where
    `attribution` is auto and some rank's kernels went by launch call, the others are read
    again by that rule, so that the columns compare."""
    def run(todo: list[int], launch: bool) -> dict[int, RankFigures]:
        args = [(files[i], i, nsys_bin, force, require, attribution,
                 run_jsons[first + i] if first + i < len(run_jsons) else None, scope, launch) for i in todo]
        if jobs <= 1 or len(todo) < 2:
            return {i: rank_figures(*a) for i, a in zip(todo, args)}
        with ProcessPoolExecutor(min(jobs, len(todo))) as pool:
            return dict(zip(todo, pool.map(rank_figures, *zip(*args))))

    got = run(list(range(len(files))), False)
    if attribution == "auto" and any(f.mode == "launch" for f in got.values()):
        got |= run([i for i, f in got.items() if f.mode not in (None, "launch")], True)
    return [got[i] for i in range(len(files))]


@dataclass
class ReportInputs:
    """What a report shows of its profiles, one entry per column (a rank set's ranks are
    columns) but `ranks`, one cross-rank table (`cross_rank`) per rank set."""

    breakdowns: list[Breakdown]
    answers: list[dict]  # answers (a)-(e) per column
    ranks: list[dict]
    figures: list[dict]  # HTA's figures (`harness.trace.analyses.gpu_time`) with the column's label and GPU
    analyses: list[dict]  # per column, every registered analysis's result by name (`run_analyses`)


@dataclass
class KernelBreakdown:
    """What a comparison shows of its profiles, one entry per profiled backend in order: its
    breakdown, answers (a)-(e) and the registered analyses' results (by name)."""

    breakdowns: list[Breakdown]
    answers: list[dict]
    analyses: dict[str, dict]  # backend -> name -> result


def report_inputs(paths: Sequence[str | Path], labels: Sequence[str | None] = (), run_jsons: Sequence[str | Path] = (),
                  require: Sequence[str] = (), nsys_bin: str | None = None, attribution: str = "auto",
                  force: bool = False, scope: str = "all", jobs: int | None = None,
                  breakdowns_done: Callable[[list[Breakdown]], None] | None = None) -> ReportInputs:
    """Breakdowns (one per column), their answers, a cross-rank table per rank set, HTA's
    figures per column (`harness.trace.analyses.gpu_time`, in `scope`) and every registered
    analysis per column (`harness.trace.analyses.registry`). The i-th
    `harness.run` result JSON goes with the i-th column. A rank set's files are read in
    `jobs` processes (default: one per core), each keeping only its rank's figures.
    `breakdowns_done` is called with the breakdowns once they are all known, before the
    last profile's answers and figures (the report's figure is drawn meanwhile)."""
    jobs = workers() if jobs is None else jobs
    bds, answer_sets, tables, figures, results = [], [], [], [], []
    items = list(_items(paths))
    for i, item in enumerate(items):
        if isinstance(item, list):
            if all(rank_in_name(f) is not None for f in item):  # rank10 after rank9, not after rank1
                item = sorted(item, key=rank_in_name)
            got = _read_ranks(item, jobs, nsys_bin, force, require, attribution, run_jsons, scope, len(bds))
            rs = rank_set(item, [f.info for f in got])
            for f in got:
                rank = next(r for r, info in rs.profiles.items() if info.path == f.info.path)
                f.breakdown.label = f.figures["label"] = f"rank{rank}"
            by_rank = {rank: next(f for f in got if f.info.path == info.path) for rank, info in rs.profiles.items()}
            mine = [f.breakdown for f in by_rank.values()]
            bds += mine
            answer_sets += [f.answers for f in by_rank.values()]
            figures += [f.figures for f in by_rank.values()]
            results += [f.analyses for f in by_rank.values()]
            split = {r: f.collectives for r, f in by_rank.items()}
            tables.append(cross_rank(rs, mine, {r: f.communication for r, f in by_rank.items()},
                                     split if None not in split.values() else None))
            continue
        profile = _read(item, labels[i] if i < len(labels) else None, nsys_bin, force)
        split_set = split_processes(profile)
        profiles = list(split_set.profiles.values()) if split_set else [profile]
        sels = [select(p, attribution) for p in profiles]
        if split_set and attribution == "auto" and any(s and s.mode == "launch" for s in sels):
            # one rule for every rank, so that the columns compare
            sels = [s if s is None or s.mode == "launch" else select(p, "launch") for p, s in zip(profiles, sels)]
        mine, metas = [], []
        for profile, sel in zip(profiles, sels):
            k = len(bds)
            with stage("trace", f"analysing {profile.label} ({len(profile.kernels):,} GPU activities, "
                                 f"{len(profile.ranges):,} ranges)"):
                bd, meta = _breakdown(profile, sel, require, attribution, run_jsons[k] if k < len(run_jsons) else None)
            bds.append(bd)
            mine.append(bd)
            metas.append(meta)
        if breakdowns_done and i == len(items) - 1:
            breakdowns_done(bds)
            breakdowns_done = None
        mine_results = []
        for profile, bd, meta, sel in zip(profiles, mine, metas, sels):
            ans, fig, got = _figures(profile, bd, meta, scope, sel, rank=bool(split_set))
            answer_sets.append(ans)
            figures.append(fig)
            mine_results.append(got)
        results += mine_results
        if split_set:
            split = {r: got.get("collectives") for r, got in zip(split_set.profiles, mine_results)}
            tables.append(cross_rank(split_set, mine, {r: got["communication"] for r, got in
                                                       zip(split_set.profiles, mine_results)},
                                     split if None not in split.values() else None))
    if breakdowns_done:  # the last item was a rank set
        breakdowns_done(bds)
    return ReportInputs(bds, answer_sets, tables, figures, results)
