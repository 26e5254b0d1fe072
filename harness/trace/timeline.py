"""One timeline of several profiles, their measured steps lined up: Chrome trace-event JSON.

The Trace Event Format (the JSON that chrome://tracing and ui.perfetto.dev open; Perfetto's
Python package writes its protobuf format and reads traces, but offers no writer for this
JSON, so it is written here from the format's documentation). `build_timeline` returns the
document; `write_timeline` writes it gzipped.

Layout
------
- One process per run (a backend, a rank, a profile) and per kind of step it times: JAX's
  split ``step`` and its ``fused_step`` are two processes, ``jax`` and ``jax fused_step``.
- In each process, one thread per host thread with ranges or kernel launches ("host ..."),
  whose slices are the harness's ranges and the library ranges inside them
  (`harness.trace.library_ranges`; category ``user_annotation``, as torch.profiler
  writes them) and each kernel's launch call, and one thread per GPU stream ("GPU d stream
  s"), whose slices are the kernels (category ``kernel``, with args ``device`` and
  ``stream``, so `harness.trace.sources.kineto.load_torch_trace` reads the
  timeline back).
- Steps aligned: measured step k of every process starts at the same time T_k; each step's
  events move by the difference between its own start and T_k, and T_{k+1} follows the
  longest step k of all processes, plus a tenth of it. Only measured steps (those the
  breakdown's per-step figures count) are laid out; ``steps`` picks some of them by index,
  or "all" lays out every kernel and range of each profile, moved so that the first measured
  steps start together, after the longest lead-in (warm-up) of any profile.
- Kernels carry args: category, phase (innermost range), step, device, stream, correlation
  (CUPTI's id, where recorded), grid and block (an nsys export's launch configuration),
  layer (with layer ranges or XLA's metadata) and color (the category's colour in the PNGs,
  `harness.trace.kernels.CATEGORY_COLORS`). A launch is a zero-length slice ``launch`` on
  its host thread bound to its kernel by a flow (``bind_id`` with ``flow_out``/``flow_in``,
  the format's flow events v2).
- Chrome's ``cname`` takes only its reserved colour names: each category gets the reserved
  name whose colour is nearest to the category's PNG colour, distinct for every category
  (`CNAMES`, computed once in category order). Perfetto ignores ``cname`` and colours by name;
  the args' ``color`` keeps the exact colour.
- Marks (`Mark`: the diff's largest moves) are slices on a process of their own, spanning
  the phase they name in the first laid-out step of the run they refer to.

No source the harness reads records device memory over time, so the timeline has no
memory counter tracks.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.common.layer_names import LAYER_RANGE_PREFIX
from harness.trace.analyses.assign import Assignment, assign
from harness.trace.analyses.breakdown import Breakdown, load_profile
from harness.trace.analyses.hlo_join import hlo_dir, load_schedules
from harness.trace.kernels import CATEGORY_COLORS, Category
from harness.trace.library_ranges import library_of
from harness.trace.profile import UNKNOWN, Profile
from harness.trace.sources.launch_config import launch_configs

STEPS_ALL = "all"
GAP = 0.1  # between aligned steps, as a share of the longest step
NAME_WIDTH = 160
_CATS = list(Category)
# Chrome's reserved colour names (catapult's color_scheme) and their RGB.
RESERVED = {
    "thread_state_uninterruptible": (182, 125, 143), "thread_state_iowait": (255, 140, 0),
    "thread_state_running": (126, 200, 148), "thread_state_runnable": (133, 160, 210),
    "thread_state_unknown": (199, 155, 125), "background_memory_dump": (0, 180, 180),
    "light_memory_dump": (0, 0, 180), "detailed_memory_dump": (180, 0, 180), "generic_work": (125, 125, 125),
    "good": (0, 125, 0), "bad": (180, 125, 0), "terrible": (180, 0, 0), "grey": (221, 221, 221),
    "yellow": (255, 255, 0), "olive": (100, 100, 0), "rail_response": (67, 135, 253),
    "rail_animation": (244, 74, 63), "rail_idle": (238, 142, 0), "rail_load": (13, 168, 97),
    "startup": (230, 230, 0), "cq_build_passed": (153, 238, 102), "cq_build_failed": (238, 136, 136),
    "cq_build_abandoned": (187, 187, 187), "cq_build_attempt_failed": (197, 81, 81),
}


def _nearest_names() -> dict[Category, str]:
    free, out = dict(RESERVED), {}
    for cat, hex_colour in CATEGORY_COLORS.items():
        rgb = np.array([int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)])
        name = min(free, key=lambda n: float(((np.array(free[n]) - rgb) ** 2).sum()))
        out[cat] = name
        del free[name]
    return out


CNAMES = _nearest_names()


@dataclass(frozen=True)
class Run:
    """One profile to lay out: its label, its kernels and ranges, the breakdown's decisions."""

    label: str
    profile: Profile
    assignment: Assignment
    launch_configs: Mapping[tuple[int, int], tuple[str, str]] | None = None  # (start, correlation) -> grid, block


def timeline_run(profile: Profile, mode: str, schedules: Mapping | None = None) -> Run:
    """`profile` as a timeline run: the breakdown's decisions under attribution `mode`, and
    each kernel's grid and block where the profile is an nsys export."""
    configs = launch_configs(profile.path) if profile.source == "nsys" else None
    return Run(profile.label, profile, assign(profile, mode, schedules), configs)


@dataclass(frozen=True)
class Mark:
    """An annotation: `text` over `phase` of the run labelled `label` (the whole step if None)."""

    text: str
    label: str
    phase: str | None = None


def _short(name: str) -> str:
    return name if len(name) <= NAME_WIDTH else name[: NAME_WIDTH - 1] + "…"


@dataclass
class _Track:
    """One process: a run's instances of one root name (or the whole run with "all")."""

    run: Run
    name: str
    root: str  # the root range name ("" without ranges)
    instances: list[int | None]  # per laid-out slot: the root range, None where the run has no such step
    spans: list[tuple[int, int] | None]  # per slot: (start, end) ns of that step, kernels included


def _tracks(runs: Sequence[Run], steps: Sequence[int] | str | None) -> list[_Track]:
    tracks = []
    for run in runs:
        a, kt = run.assignment, run.profile.kernels
        roots = a.steps or {"": [None]}
        for root_name, insts in roots.items():
            picked = insts if steps in (None, STEPS_ALL) else [insts[k] if k < len(insts) else None for k in steps]
            spans = []
            for inst in picked:
                mask = a.measured & (a.root == inst) if inst is not None else a.measured
                ends = kt.end[mask]
                if inst is None:
                    spans.append((int(kt.start[mask].min()), int(ends.max())) if mask.any() else None)
                    continue
                r = a.ranges[inst]
                spans.append((r.start, max(r.end, int(ends.max()) if len(ends) else r.end)))
            name = run.label if len(roots) == 1 or root_name == "step" else f"{run.label} {root_name}"
            tracks.append(_Track(run, name, root_name, picked, spans))
            if steps == STEPS_ALL:
                break  # the whole profile once, aligned at its first root's first measured step
    return tracks


class _Writer:
    """Accumulates events; owns the process and thread numbering."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.next_flow = 1

    def meta(self, pid: int, tid: int | None, kind: str, value: object) -> None:
        e = {"ph": "M", "pid": pid, "name": kind, "args": {"name" if "name" in kind else "sort_index": value}}
        if tid is not None:
            e["tid"] = tid
        self.events.append(e)

    def slice(self, pid: int, tid: int, name: str, cat: str, start: int, end: int, args: dict | None = None,
              **extra: object) -> None:
        e = {"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": cat, "ts": start / 1000,
             "dur": (end - start) / 1000, **extra}
        if args:
            e["args"] = args
        self.events.append(e)


def _lay_out(w: _Writer, pid: int, track: _Track, shifts: list[tuple[int, int, int, int | None]],
             slot_index: list[int | None]) -> None:
    """The events of one track; `shifts`: (from, to, shift, root) per laid-out step."""
    run, a, kt = track.run, track.run.assignment, track.run.profile.kernels
    threads = sorted({r.thread for r in a.ranges if r.thread is not None} |
                     {int(t) for t in np.unique(kt.thread[kt.launch != UNKNOWN])})
    host = {t: i + 1 for i, t in enumerate(threads)} or {None: 1}
    for t, tid in host.items():
        w.meta(pid, tid, "thread_name", f"host {t}" if t is not None else "host")
        w.meta(pid, tid, "thread_sort_index", tid)
    streams: dict[tuple[int, int], int] = {}
    for (lo, hi, shift, inst), slot in zip(shifts, slot_index):
        if inst is None and a.steps:
            continue
        if inst is None or slot is None:
            mask = np.ones(len(kt), bool) if slot is None else a.measured.copy()
            rng = list(run.profile.ranges) if slot is None else []
        else:
            mask = a.measured & (a.root == inst)
            rng = [r for i, r in enumerate(a.ranges) if a.range_root[i] == inst]
            rng += [r for r in run.profile.ranges
                    if (r.name.startswith(LAYER_RANGE_PREFIX) or library_of(r.name)) and lo <= r.start <= r.end <= hi]
        for r in rng:
            w.slice(pid, host.get(r.thread, 1), r.name, "user_annotation", r.start - shift, r.end - shift)
        for i in np.flatnonzero(mask):
            key = (int(kt.device[i]), int(kt.stream[i]))
            if key not in streams:
                streams[key] = 1000 + len(streams)
                w.meta(pid, streams[key], "thread_name", f"GPU {key[0]} stream {key[1]}")
                w.meta(pid, streams[key], "thread_sort_index", streams[key])
            cat = _CATS[a.category[i]]
            inner = int(a.inner[i])
            args = {"category": cat.value, "phase": a.ranges[inner].name if inner >= 0 else "(no range)",
                    "step": slot, "device": key[0], "stream": key[1], "color": CATEGORY_COLORS[cat]}
            if kt.correlation[i] != UNKNOWN:
                args["correlation"] = int(kt.correlation[i])
            if run.launch_configs and (config := run.launch_configs.get((int(kt.start[i]), int(kt.correlation[i])))):
                args["grid"], args["block"] = config
            if a.layers is not None:
                args["layer"] = str(a.layers[i])
            name = kt.name_of(i)
            if len(name) > NAME_WIDTH:
                args["name"] = name
            flow = {}
            if kt.launch[i] != UNKNOWN:
                flow = {"bind_id": w.next_flow}
                w.next_flow += 1
                launch = int(kt.launch[i]) - shift
                w.slice(pid, host.get(int(kt.thread[i]), 1), "launch", "cuda_runtime", launch, launch,
                        {"correlation": args.get("correlation")}, **flow, flow_out=True)
            w.slice(pid, streams[key], _short(name), "kernel", int(kt.start[i]) - shift, int(kt.end[i]) - shift,
                    args, cname=CNAMES[cat], **({**flow, "flow_in": True} if flow else {}))


def _earliest(run: Run) -> int:
    """The profile's first event: kernel, range or launch call (ns)."""
    kt = run.profile.kernels  # kernels and ranges are sorted by start
    launches = kt.launch[kt.launch != UNKNOWN]
    firsts = [*kt.start[:1].tolist(), *(r.start for r in run.profile.ranges[:1])]
    return int(min(firsts + ([int(launches.min())] if len(launches) else [])))


def measured_steps(runs: Sequence[Run]) -> int:
    """The most measured steps any of `runs` holds (a run without step ranges: one): the
    timeline's step indices run below it."""
    return max((len(insts) for run in runs for insts in (run.assignment.steps or {"": [None]}).values()),
               default=0)


def build_timeline(runs: Sequence[Run], steps: Sequence[int] | str | None = None,
                   marks: Sequence[Mark] = ()) -> dict:
    """The trace-event document of `runs`, steps aligned (module docstring). `steps`: None
    for every measured step, indices into the measured steps, or "all"."""
    tracks = _tracks(runs, steps)
    slots = max(len(t.spans) for t in tracks) if tracks else 0
    longest = [max((s[1] - s[0] for t in tracks if k < len(t.spans) and (s := t.spans[k])), default=0)
               for k in range(slots)]
    starts = np.concatenate([[0], np.cumsum([int(n * (1 + GAP)) for n in longest])]).astype(np.int64)
    if steps == STEPS_ALL:  # whole profiles: their first measured steps aligned where no event is before 0
        starts += max((t.spans[0][0] - _earliest(t.run) for t in tracks if t.spans and t.spans[0]), default=0)
    w = _Writer()
    step_index = [None] * slots if steps == STEPS_ALL else list(range(slots)) if steps is None else list(steps)
    aligned = []
    for pid, track in enumerate(tracks, start=1):
        w.meta(pid, None, "process_name", track.name)
        w.meta(pid, None, "process_sort_index", pid)
        shifts = []
        for k, (span, inst) in enumerate(zip(track.spans, track.instances)):
            shift = span[0] - int(starts[k]) if span else 0
            shifts.append((*(span or (0, 0)), shift, inst))
        if steps == STEPS_ALL:
            shifts = shifts[:1]
        _lay_out(w, pid, track, shifts, step_index)
        aligned.append((track, shifts[0]))
    if marks:
        _marks(w, len(tracks) + 1, marks, aligned)
    return {"traceEvents": w.events, "displayTimeUnit": "ms",
            "otherData": {"steps": "all" if steps == STEPS_ALL else step_index,
                          "step_starts_us": [int(s) / 1000 for s in starts[:slots]],
                          "category_cname": {c.value: n for c, n in CNAMES.items()}}}


def _marks(w: _Writer, pid: int, marks: Sequence[Mark],
           aligned: Sequence[tuple[_Track, tuple[int, int, int, int | None]]]) -> None:
    """Each mark over its phase in the first laid-out step of its run's track of that phase
    (JAX's fused step has a track of its own), else over that step."""
    w.meta(pid, None, "process_name", "largest moves")
    w.meta(pid, None, "process_sort_index", 0)
    for tid, mark in enumerate(marks, start=1):
        own = [(t, first) for t, first in aligned if t.run.label == mark.label] or list(aligned[:1])
        track, (lo, hi, shift, _) = next(((t, f) for t, f in own if t.root == mark.phase), own[0])
        phase = next((r for r in track.run.assignment.ranges if r.name == mark.phase and lo <= r.start <= hi), None)
        start, end = (phase.start, phase.end) if phase else (lo, hi)
        w.meta(pid, tid, "thread_name", mark.text if len(mark.text) <= 60 else mark.text[:59] + "…")
        w.slice(pid, tid, mark.text, "annotation", start - shift, end - shift,
                {"run": mark.label, "phase": mark.phase})


def runs_from_files(paths: Sequence[str | Path], bds: Sequence[Breakdown], nsys_bin: str | None = None,
                    force: bool = False, labels: Sequence[str] | None = None) -> list[Run]:
    """The profiles at `paths` as timeline runs, each assigned as its breakdown (the i-th of
    `bds`) was and labelled like it, or by the i-th of `labels`. An ``.nsys-rep`` is read
    from the SQLite export its breakdown just wrote beside it (exporting a large report again
    takes minutes)."""
    runs = []
    for i, (path, bd) in enumerate(zip(paths, bds)):
        sqlite = Path(path).with_suffix(".sqlite")
        source = sqlite if str(path).endswith(".nsys-rep") and sqlite.is_file() else path
        profile = load_profile(source, labels[i] if labels else bd.label, nsys_bin, force)
        hlo = hlo_dir(path)
        runs.append(timeline_run(profile, bd.attribution, load_schedules(hlo) if hlo.is_dir() else None))
    return runs


def runs_from_inputs(paths: Sequence[str | Path], bds: Sequence[Breakdown], labels: Sequence[str | None] = (),
                     nsys_bin: str | None = None, force: bool = False) -> list[Run]:
    """`harness.report`'s columns as timeline runs: every profile of `paths`, a rank set read
    as its ranks (one process each), assigned as its column's breakdown (the i-th of `bds`)
    was. An ``.nsys-rep`` is read from the SQLite export its breakdown just wrote beside it."""
    from harness.trace.analyses.ranks import load_inputs

    sources = [sqlite if str(p).endswith(".nsys-rep") and (sqlite := Path(p).with_suffix(".sqlite")).is_file()
               else p for p in paths]
    profiles = [p for item in load_inputs(sources, labels, nsys_bin, force) for p in item.profiles]
    runs = []
    for profile, bd in zip(profiles, bds):
        hlo = hlo_dir(profile.path)
        runs.append(timeline_run(profile, bd.attribution, load_schedules(hlo) if hlo.is_dir() else None))
    return runs


def write_timeline(path: str | Path, document: dict) -> Path:
    """Write `document` as gzipped JSON (``timeline.json.gz`` opens as is in Perfetto and Chrome)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", compresslevel=6) as f:
        json.dump(document, f, separators=(",", ":"))
    return path
