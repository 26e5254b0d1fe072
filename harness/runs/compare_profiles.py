"""What a comparison does with the profiles its runs left: keeps them, breaks them down
by kernel, measures the communication per rank or device, lays them on one timeline."""

from __future__ import annotations

import os
import shutil

from harness.common.progress import file_size, stage
from harness.trace.analyses.ranks import KernelBreakdown


def keep_profiles(profiles: dict[str, str], dest: str) -> None:
    """Copy each profile, and the SQLite export beside an .nsys-rep, into `dest`."""
    os.makedirs(dest, exist_ok=True)
    with stage("compare", f"copying {len(profiles)} profiles to {dest}", now=True):
        for path in profiles.values():
            sqlite = os.path.splitext(path)[0] + ".sqlite"
            for src in (path, sqlite) if path.endswith(".nsys-rep") and os.path.exists(sqlite) else (path,):
                copy = shutil.copytree if os.path.isdir(src) else shutil.copy2
                copy(src, os.path.join(dest, os.path.basename(src)))


def kernel_breakdown(profiles: dict[str, str], workdir: str, nsys_bin: str | None) -> KernelBreakdown:
    """Kernel breakdowns, the answers (a)-(e) and the registered analyses, one per profiled
    backend (`harness.trace.analyses.ranks.analyse_column`, as the report analyses a column),
    each saying on stderr what it reads and how long it took (a large profile takes minutes)."""
    from harness.trace.analyses.ranks import analyse_column
    from harness.trace.analyses.selection import select
    from harness.trace.sources.load import load_profile

    out = KernelBreakdown([], [], {})
    for i, (backend, path) in enumerate(profiles.items(), 1):
        with stage("compare", f"kernel breakdown {i}/{len(profiles)}: {backend} ({file_size(path)})",
                   now=True) as found:
            profile = load_profile(path, backend, nsys_bin)
            col = analyse_column(profile, select(profile), run_json=os.path.join(workdir, f"{backend}.json"))
            found(f"phases {', '.join(col.breakdown.phases) or 'none'}")
        out.breakdowns.append(col.breakdown)
        out.answers.append(col.answers)
        out.analyses[backend] = col.analyses
    return out


def communication_overlap(profiles: dict[str, str], devices: int, nsys_bin: str | None,
                          runs: dict[str, dict] | None = None) -> dict[str, dict]:
    """Per backend, communication hidden under compute and exposed, per rank (torch: every
    rank's profile beside rank 0's) or per device (JAX's one profile), and split into
    transfer and waiting, with bandwidth from the gradients' size of the run in `runs`."""
    from harness import backends
    from harness.trace.analyses.collectives import collective_bytes
    from harness.trace.analyses.overlap import rank_profiles

    out = {}
    for backend, first in profiles.items():
        files = rank_files(first, devices)
        with stage("compare", f"communication overlap: {backend}, {len(files)} profiles", now=True):
            record = backends.get(backend)
            sizes = collective_bytes((runs or {}).get(backend), record.gathers_parameters, record.bf16_gradient_sums)
            out[backend] = rank_profiles(files, nsys_bin, sizes)
    return out


def rank_files(first: str, devices: int) -> list[str]:
    """A backend's profiles: every rank's beside rank 0's (a process per device), else the one."""
    paths = [first.replace(".rank0.", f".rank{r}.") for r in range(devices)] if ".rank0." in first else [first]
    return [p for p in paths if os.path.exists(p)]


def backend_timeline(profiles: dict[str, str], bds: list, devices: int, nsys_bin: str | None,
                     steps: tuple[int, ...] | str | None) -> dict:
    """The profiled backends on one trace (`harness.trace.timeline`): one process per backend,
    and per rank where a backend was profiled rank by rank."""
    from harness.trace.timeline import build_timeline, runs_from_files

    paths, per_path, labels = [], [], []
    for (backend, first), bd in zip(profiles.items(), bds):
        ranks = rank_files(first, devices)
        for r, path in enumerate(ranks):
            paths.append(path)
            per_path.append(bd)  # every rank runs the same program: rank 0's attribution rule holds
            labels.append(f"{backend} rank {r}" if len(ranks) > 1 else backend)
    with stage("compare", f"timeline: {', '.join(labels)} on one trace", now=True):
        return build_timeline(runs_from_files(paths, per_path, nsys_bin, labels=labels), steps)
