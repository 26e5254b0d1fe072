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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.common.progress import file_size, stage
from harness.trace.analyses.answers import answers, harness_metadata, run_json_problems
from harness.trace.analyses.breakdown import Breakdown, breakdown, load_profile
from harness.trace.analyses.collectives import profile_split
from harness.trace.analyses.gpu_time import gpu_time
from harness.trace.analyses.hlo_join import hlo_dir, load_schedules
from harness.trace.analyses.overlap import overlap, per_step_exposure
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


def load_inputs(paths: Sequence[str | Path], labels: Sequence[str | None] = (), nsys_bin: str | None = None,
                force: bool = False) -> list[Input]:
    """The report's inputs, loaded and grouped (module docstring); the i-th label names the
    i-th path's column (a rank set's columns are its ranks)."""
    paths = [Path(p) for p in paths]
    out: list[Input] = []
    i = 0
    while i < len(paths):
        path = paths[i]
        label = labels[i] if i < len(labels) else None
        if path.is_dir() and not _is_jax_dir(path):
            files = profile_files(path)
            out.append(_set(files, nsys_bin, force))
            i += 1
            continue
        group = [path]
        while (rank_in_name(path) is not None and i + len(group) < len(paths)
               and job_name(paths[i + len(group)]) == job_name(path)
               and rank_in_name(paths[i + len(group)]) is not None):
            group.append(paths[i + len(group)])
        i += len(group)
        if len(group) > 1:
            out.append(_set(group, nsys_bin, force))
            continue
        profile = _read(path, label, nsys_bin, force)
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
        if split_processes(p):
            raise ProfileError(f"{f}: holds several processes; pass it alone (its processes are its ranks), "
                               "not in a set of per-rank files")
    rs = rank_set(files, profiles)
    return Input(list(rs.profiles.values()), rs)


def cross_rank(rs: RankSet, bds: Sequence[Breakdown], selections: Mapping[int, Selection | None]) -> dict:
    """Per phase and rank: median GPU ms and range ms per step; per phase the straggler
    (the rank with the longest median range, and slowest/fastest); per rank the
    communication kernels of the measured steps (`selections`, per rank the breakdown's:
    the first step set apart, each kernel in the step that launched it where the program
    does not synchronize), hidden and exposed (ms, summed over the steps and devices), with the
    same per step (`per_step`); and the communication split into transfer and waiting by
    aligning the ranks' collectives (`split`: None where the ranks' clocks are not known to
    be one, or fewer than two ranks hold collectives)."""
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
    communication = {}
    for rank, profile in rs.profiles.items():
        sel = selections[rank]
        devices = overlap(profile.kernels, selected=sel) if sel else overlap(profile.kernels)
        total = sum(d["communication_ms"] for d in devices)
        hidden = sum(d["hidden_ms"] for d in devices)
        steps = sum(len(i) for name, i in sel.instances.items() if name in STEP_RANGES) if sel else 0
        communication[rank] = {"communication_ms": total, "hidden_ms": hidden, "exposed_ms": total - hidden,
                               "hidden_share": hidden / total if total else None, "step_ranges": steps,
                               "per_step": per_step_exposure({"ranks": [{"overlap": devices, "phases_ms": {}}]})}
    split = None
    if None not in selections.values() and None not in {p.session_start_ns for p in rs.profiles.values()}:
        split = profile_split(rs.profiles, selections=selections)
    return {"name": rs.name, "rank_source": rs.rank_source, "ranks": ranks, "labels": [bd.label for bd in bds],
            "phases": phases,
            "straggler": straggler, "communication": communication, "split": split}


def report_inputs(paths: Sequence[str | Path], labels: Sequence[str | None] = (), run_jsons: Sequence[str | Path] = (),
                  require: Sequence[str] = (), nsys_bin: str | None = None, attribution: str = "auto",
                  force: bool = False,
                  scope: str = "all") -> tuple[list[Breakdown], list[dict], list[dict], list[dict]]:
    """Breakdowns (one per column), their answers, a cross-rank table per rank set, and
    HTA's figures per column (`harness.trace.analyses.gpu_time`, in `scope`). The i-th
    `harness.run` result JSON goes with the i-th column."""
    bds, answer_sets, tables, figures = [], [], [], []
    for item in load_inputs(paths, labels, nsys_bin, force):
        mine = []
        sels = [select(p, attribution) for p in item.profiles]
        if item.rank_set and attribution == "auto" and any(s and s.mode == "launch" for s in sels):
            # one rule for every rank, so that the columns compare
            sels = [s if s is None or s.mode == "launch" else select(p, "launch") for p, s in zip(item.profiles, sels)]
        for profile, sel in zip(item.profiles, sels):
            with stage("trace", f"analysing {profile.label} ({len(profile.kernels):,} GPU activities, "
                                 f"{len(profile.ranges):,} ranges)"):
                hlo = hlo_dir(profile.path)
                bd = breakdown(profile, require, attribution,
                               schedules=load_schedules(hlo) if hlo.is_dir() else None, selection=sel)
                i = len(bds)
                meta = harness_metadata(run_jsons[i]) if i < len(run_jsons) else {}
                bd.warnings += run_json_problems(profile, bd, meta) if meta else []
                bds.append(bd)
                answer_sets.append(answers(bd, meta.get("forward_ms"), meta))
                figures.append({"label": bd.label, "gpu": profile.gpu, **gpu_time(profile, scope)})
                mine.append(bd)
        if item.rank_set:
            tables.append(cross_rank(item.rank_set, mine, dict(zip(item.rank_set.profiles, sels))))
    return bds, answer_sets, tables, figures
