"""What names a run, resolved into `Run`: timings from its `harness.run` document and,
where a profile exists, its kernel breakdown per phase.

A run is named by
- ``FOLDER:BACKEND``: a backend inside a `harness.compare` result folder (its
  summary.json holds ``runs.<backend>``, the `harness.run` document; a profiled compare
  adds kernels.json, the breakdown per backend); ``FOLDER`` alone names every backend;
- a `harness.run` result JSON; ``X.harness.json`` picks up the profile ``X.sqlite.gz``,
  ``X.sqlite`` or ``X.nsys-rep`` beside it;
- a profile (``.nsys-rep``, ``.sqlite``, ``.sqlite.gz``), with ``X.harness.json`` beside
  it when there is one;
- any user's profile: a torch.profiler trace (``.json[.gz]`` holding ``traceEvents``), a
  JAX profiler trace (``.xplane.pb[.gz]``), a folder of one job's per-rank files, or an
  nsys profile of several processes (`harness.trace.analyses.ranks`). A multi-rank run's
  phases are rank 0's (every rank attributed by one rule), its overlap summed over the
  ranks; `mismatch` names what two such runs differ in (GPU, rank count).

A data-parallel run's overlap (communication hidden under compute, `harness.trace.analyses.overlap`)
comes from the compare folder's summary, or from the profile where it has communication
kernels (of a torch run, rank 0's profile).

A committed diff names its runs again for `harness.regenerate`: `several_runs` reads a
several-runs diff's documents from its diff.json, `run_documents_by_label` finds the two of a
diff of one run a side in the diff's folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from harness import backends
from harness.common.documents import COMPARE_SCHEMA, CompareDocument, DocumentError, RunDocument
from harness.trace.analyses.breakdown import breakdown, load_profile
from harness.trace.analyses.overlap import rank_analysis
from harness.trace.analyses.ranks import report_inputs
from harness.trace.analyses.registry import Context, run_analyses
from harness.trace.analyses.selection import select
from harness.trace.kernels import canonical_name
from harness.trace.profile import PROFILER_STEP, ProfileError
from harness.trace.sources.load import launches_of
from harness.trace.sources.nsys_launches import Launches

PROFILE_SUFFIXES = (".sqlite.gz", ".sqlite", ".nsys-rep")
HARNESS_SUFFIX = ".harness.json"


class InputError(ValueError):
    """A name that is not a run; the message says what was expected."""


@dataclass
class KernelRow:
    name: str
    category: str
    calls_per_step: float
    ns_per_step: float
    gemm: dict | None  # harness.trace.kernels.GemmInfo's fields


@dataclass
class PhaseProfile:
    """One phase of a profile, per measured step."""

    range_ns: float
    gpu_ns: float
    kernels: float
    categories: dict[str, float]  # category -> ns
    rows: list[KernelRow]
    launches: Launches | None = None
    busy_ns: float | None = None  # union of the kernels' intervals over streams (None: not recorded)
    hidden_communication_ns: float = 0.0  # communication under compute on other streams
    devices: int = 1  # the device timelines the figures are the per-device mean of


@dataclass
class Run:
    label: str
    source: str  # what named it
    doc: dict | None  # the harness.run document
    phases: dict[str, PhaseProfile] | None = None  # from a profile; None without one
    notes: list[str] = field(default_factory=list)
    layers: dict[str, dict[str, float]] | None = None  # phase -> canonical layer -> ns per step, where recorded
    overlap: dict | None = None  # `rank_analysis` totals, where the run has communication kernels
    profile: Path | None = None  # the profile file, where the run was named by it or beside it
    gpu: str | None = None  # the GPU's name, where the profile records it
    ranks: int = 1  # the ranks (processes) of a profile
    analyses: dict | None = None  # the registered analyses' results by name (of rank 0), where profiled


def _gemm_fields(info: object) -> dict | None:
    if info is None:
        return None
    if isinstance(info, dict):
        return info
    return {k: getattr(info, k) for k in ("arch", "types", "math", "transpose", "tile")}


def _phase(p: object, launches: Launches | None = None) -> PhaseProfile:
    """From a `PhaseStats` or its JSON form (kernels.json of a compare folder). Kernel names
    take one spelling (`canonical_name`), so that an nsys profile and a torch.profiler
    trace of the same kernels name them alike; rows that meet are summed."""
    get = (lambda k: p[k]) if isinstance(p, dict) else (lambda k: getattr(p, k))
    rows: dict[tuple[str, str], KernelRow] = {}
    for k in get("kernels"):
        name, category, calls, ns = (k[f] if isinstance(k, dict) else getattr(k, f)
                                     for f in ("name", "category", "calls_per_step", "ns_per_step"))
        key = (canonical_name(name), category)
        seen = rows.get(key)
        rows[key] = (KernelRow(key[0], category, calls, ns, _gemm_fields(k["gemm"] if isinstance(k, dict) else k.gemm))
                     if seen is None else replace(seen, calls_per_step=seen.calls_per_step + calls,
                                                  ns_per_step=seen.ns_per_step + ns))
    opt = (lambda k, d: p.get(k, d)) if isinstance(p, dict) else (lambda k, d: getattr(p, k, d))
    return PhaseProfile(get("range_ns_per_step"), get("gpu_ns_per_step"), get("kernels_per_step"),
                        dict(get("categories")), sorted(rows.values(), key=lambda r: -r.ns_per_step), launches,
                        opt("busy_ns_per_step", None), opt("hidden_communication_ns_per_step", 0.0),
                        opt("devices", 1))


def _load_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: not readable as JSON ({exc})") from None


def _profile_phases(path: Path, nsys_bin: str | None) -> tuple[dict[str, PhaseProfile], dict | None, dict | None,
                                                                dict]:
    """The phases of a profile's breakdown, its layers (None where it recorded none), its
    communication overlap (None without communication kernels) and the registered analyses."""
    try:
        profile = load_profile(path, nsys_bin=nsys_bin)
        sel = select(profile)
        bd = breakdown(profile, selection=sel)
        results = run_analyses(profile, Context(bd, sel))
    except ProfileError as exc:
        raise InputError(str(exc)) from None
    launches = launches_of(path, nsys_bin)
    overlap = rank_analysis({0: profile})
    return ({name: _phase(p, launches.get(name)) for name, p in bd.phases.items()}, bd.layers or None,
            overlap if overlap["communication_ms"] else None, results)


def _user_profile(path: Path, nsys_bin: str | None) -> Run:
    """A run from any user's profile (module docstring): rank 0's phases, every rank's overlap."""
    try:
        inputs = report_inputs([path], nsys_bin=nsys_bin)
        bds, tables, figures = inputs.breakdowns, inputs.ranks, inputs.figures
    except ProfileError as exc:
        raise InputError(str(exc)) from None
    gpu = {f["gpu"] for f in figures} - {None}
    comm = [c for t in tables for c in t["communication"].values()]
    total, hidden = sum(c["communication_ms"] for c in comm), sum(c["hidden_ms"] for c in comm)
    overlap = {"communication_ms": total, "hidden_ms": hidden, "exposed_ms": total - hidden,
               "hidden_share": hidden / total} if total else None
    notes = [f"{path.name}: {len(bds)} ranks ({tables[0]['rank_source']}); phases from rank 0"] if tables else []
    # launch calls per phase, where the profile's source records them; with several processes they would mix ranks
    launches = launches_of(path, nsys_bin) if len(bds) == 1 else {}
    # torch.profiler's ProfilerStep is the step: it pairs with the other side's `step`
    phases = {"step" if name == PROFILER_STEP else name: _phase(p, launches.get(name))
              for name, p in bds[0].phases.items()}
    return Run(_stem(path), str(path), None, phases,
               [*notes, f"{path.name}: a profile without a harness.run document; times from its ranges"],
               bds[0].layers or None, overlap, path, " + ".join(sorted(gpu)) or None, len(bds), inputs.analyses[0])


def _is_trace(path: Path) -> bool:
    """A torch.profiler or JAX profiler trace, or a folder of per-rank profiles."""
    if path.is_dir():
        return not (path / "summary.json").exists()
    if path.name.endswith((".json.gz", ".xplane.pb", ".xplane.pb.gz")):
        return True
    if path.name.endswith(".json") and not path.name.endswith(HARNESS_SUFFIX):
        with open(path, "rb") as f:
            return b'"traceEvents"' in f.read(1 << 16)
    return False


def mismatch(a: Run, b: Run) -> str | None:
    """What two profiles differ in that makes them compare unlike for unlike (GPU, rank
    count), in one line; None where nothing detectable differs."""
    if a.gpu and b.gpu and a.gpu != b.gpu:
        return f"A and B ran on different GPUs ({a.gpu} vs {b.gpu}); pass --force to compare them anyway"
    if a.ranks != b.ranks:
        return f"A and B have different rank counts ({a.ranks} vs {b.ranks}); pass --force to compare them anyway"
    return None


def _stem(path: Path) -> str:
    for suffix in (HARNESS_SUFFIX, *PROFILE_SUFFIXES, ".json"):
        if path.name.endswith(suffix):
            return path.name[: -len(suffix)]
    return path.name


def _from_compare(folder: Path, backend: str | None) -> list[Run]:
    summary = _load_json(folder / "summary.json")
    try:
        runs = CompareDocument.from_dict(summary, f"{folder}/summary.json").runs
    except DocumentError as exc:
        raise InputError(str(exc)) from None
    if backend is not None and backend not in runs:
        raise InputError(f"{folder}:{backend}: no such backend; the folder holds {', '.join(runs) or 'none'}")
    kernels, layers = {}, {}
    if (folder / "kernels.json").exists():
        bds = _load_json(folder / "kernels.json")
        kernels = {bd["label"]: bd["phases"] for bd in bds}
        layers = {bd["label"]: bd.get("layers") for bd in bds}
    overlaps = summary.get("overlap") or {}
    out = []
    for name in [backend] if backend else list(runs):
        doc = summary["runs"][name]
        if not runs[name].ok:
            raise InputError(f"{folder}:{name}: the run failed ({runs[name].message})")
        if name in kernels and (problem := _summed_devices(folder, name, doc, kernels[name])):
            raise InputError(problem)
        phases = {k: _phase(p) for k, p in kernels[name].items()} if name in kernels else None
        out.append(Run(f"{folder.name}:{name}", f"{folder}:{name}", doc, phases,
                       layers=layers.get(name) or doc.get("layers"), overlap=overlaps.get(name),
                       analyses=(summary.get("analyses") or {}).get(name)))
    return out


def _summed_devices(folder: Path, name: str, doc: dict, phases: dict) -> str | None:
    """Why the kernels.json phases of a one-process data-parallel run cannot be read per
    device (None where they can): a breakdown written before the per-device figures (its
    phases record no `devices`) summed the kernels of all N devices, and its rows do not
    say which device each kernel ran on, so no figure of it can be set against one device's."""
    n = int((doc.get("data_parallel") or {}).get("n") or (doc.get("options") or {}).get("data_parallel") or 1)
    backend = (doc.get("options") or {}).get("backend")
    one_process = backend in backends.names() and backends.get(backend).one_process
    if n == 1 or not one_process or all("devices" in p for p in phases.values()):
        return None
    return (f"{folder}:{name}: its kernels.json predates the per-device figures: the kernels of its {n} devices are "
            "summed, not per device; diff its profile (kept by harness.compare --keep-profiles) or run the compare "
            "again")


def _run_doc(path: Path) -> dict:
    doc = _load_json(path)
    try:
        run = RunDocument.from_dict(doc, str(path))
    except DocumentError as exc:
        raise InputError(f"{exc}; name what `python -m harness.run --out` wrote, or a compare folder") from None
    if not run.ok:
        raise InputError(f"{path}: the run failed ({run.message})")
    return doc


def resolve(spec: str | Path, nsys_bin: str | None = None) -> list[Run]:
    """The runs `spec` names (several for a compare folder without a backend)."""
    text = str(spec)
    folder, _, backend = text.rpartition(":")
    if folder and Path(folder).is_dir():
        return _from_compare(Path(folder), backend)
    path = Path(text)
    if path.exists() and _is_trace(path):
        return [_user_profile(path, nsys_bin)]
    if path.is_dir():
        if not (path / "summary.json").exists():
            raise InputError(f"{path}: a folder without summary.json; name a harness.compare result folder")
        return _from_compare(path, None)
    if not path.exists():
        raise InputError(f"{path}: no such file or folder")
    stem = path.parent / _stem(path)
    if path.name.endswith(PROFILE_SUFFIXES):
        beside = stem.with_name(stem.name + HARNESS_SUFFIX)
        doc = _run_doc(beside) if beside.exists() else None
        notes = [] if doc else [f"{path.name}: no {beside.name} beside it; times from the profile's ranges"]
        if doc is None:
            return [_user_profile(path, nsys_bin)]
        phases, layers, overlap, results = _profile_phases(path, nsys_bin)
        return [Run(_stem(path), text, doc, phases, notes, layers, overlap, path, analyses=results)]
    if path.name.endswith(".json"):
        doc = _load_json(path)
        if doc.get("schema") == COMPARE_SCHEMA:
            return _from_compare(path.parent, None)
        doc = _run_doc(path)
        profile = next((p for s in PROFILE_SUFFIXES if (p := stem.with_name(stem.name + s)).exists()), None)
        phases, layers, overlap, results = (_profile_phases(profile, nsys_bin) if profile and
                                            path.name.endswith(HARNESS_SUFFIX) else (None, None, None, None))
        return [Run(_stem(path), text, doc, phases, layers=layers or doc.get("layers"), overlap=overlap,
                    profile=profile if phases is not None else None, analyses=results)]
    raise InputError(f"{path}: not a run; name a compare folder[:backend], a harness.run JSON, "
                     "or a profile (.nsys-rep, .sqlite[.gz], torch.profiler .json[.gz], JAX .xplane.pb[.gz], "
                     "or a folder of per-rank profiles)")


def distinct(a: Run, b: Run) -> tuple[Run, Run]:
    """`a` and `b`, labelled apart where they share a label (the same cell's compare folder from
    two gallery folders, say): each label is then led by the fewest folders above its run that
    tell the two apart, as in `second-device/large-ctx1024-bf16-fused-profiled:jax`."""
    if a.label != b.label:
        return a, b
    above = [Path(r.source.rpartition(":")[0] if ":" in r.label else r.source).resolve().parent.parts
             for r in (a, b)]
    for k in range(1, min(map(len, above)) + 1):
        if above[0][-k:] != above[1][-k:]:
            return tuple(replace(r, label="/".join((*parts[-k:], r.label)))  # type: ignore[return-value]
                         for r, parts in zip((a, b), above, strict=True))
    return a, b


def resolve_one(spec: str | Path, nsys_bin: str | None = None) -> Run:
    """The one run `spec` names; a compare folder must name its backend."""
    runs = resolve(spec, nsys_bin)
    if len(runs) != 1:
        raise InputError(f"{spec}: holds {len(runs)} runs; name one as {spec}:BACKEND")
    return runs[0]


def several_runs(doc: dict) -> tuple[list[str], list[str]] | None:
    """The A and B run documents a several-runs diff's diff.json names (as its command named them),
    or None."""
    for phase in doc.get("phases") or []:
        if isinstance(phase, dict) and isinstance(runs := phase.get("runs"), dict):
            sides = [runs.get(side, {}).get("labels") for side in ("a", "b")]
            if all(isinstance(labels, list) and labels for labels in sides):
                return sides[0], sides[1]
    return None


def run_documents_by_label(folder: Path, labels: list) -> list[Path] | None:
    """The two run documents of a diff of one run a side, run in the diff's folder
    (`harness.diff a.json b.json --out .`, or runs/a.json runs/b.json), found by the labels the
    diff gave them (each document's name less .json); None where a label is no such document."""
    found = []
    for label in labels:
        if not isinstance(label, str) or ":" in label or label.startswith(("/", "..")):
            return None
        paths = [path for path in (folder / f"{label}.json", folder / "runs" / f"{label}.json") if path.is_file()]
        if len(paths) != 1:
            return None
        found.append(paths[0])
    return found
