"""Which kernels a profile's per-step figures count: the ranges as the breakdown reads them
(library ranges set apart: `harness.trace.library_ranges`), each kernel's innermost range
(by execution interval or by launch call, `harness.trace.analyses.attribution`), its step
(root range instance), its category, and the steady steps (warm-up ranges and a first step
set apart; the rules in `harness.trace.analyses.breakdown`'s docstring).

`select` makes these decisions once per profile; the breakdown sums them per phase, and
the analyses that must count the same kernels (communication hidden under compute,
collectives aligned across ranks, the timeline's per-kernel assignment) start from them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from harness.common.layer_names import LAYER_RANGE_PREFIX
from harness.trace.analyses import attribution as attr
from harness.trace.kernels import PHASE_RULES, Category, classify, rule_matches
from harness.trace.library_ranges import library_of
from harness.trace.profile import (
    PROFILER_STEP,
    STEP_RANGES,
    WARMUP,
    KernelTable,
    Profile,
    ProfileError,
    Range,
    numbered_instances,
    open_profiler_step,
)

ATTRIBUTIONS = ("auto", "execution", "launch")
_CATS = list(Category)
_CAT = {c: i for i, c in enumerate(_CATS)}


def _range_info(ranges: Sequence[Range], parents: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per range: inside a warm-up range, its root (-1: none), its PHASE_RULES bits."""
    n = len(ranges)
    warm, root, bits = np.zeros(n, bool), np.full(n, -1, np.int64), np.zeros(n, np.int64)
    has_steps = any(r.name in STEP_RANGES for r in ranges)
    for i, r in enumerate(ranges):
        p = parents[i]
        warm[i] = r.name == WARMUP or (p >= 0 and warm[p])
        if has_steps:
            root[i] = i if r.name in STEP_RANGES else (root[p] if p >= 0 else -1)
        else:
            root[i] = root[p] if p >= 0 else i
        own = sum(1 << j for j, (name, _, _) in enumerate(PHASE_RULES) if rule_matches(name, r.name))
        bits[i] = (bits[p] if p >= 0 else 0) | own
    return warm, root, bits


def _steady(ranges: Sequence[Range], warm: np.ndarray, root: np.ndarray) -> tuple[dict[str, list[int]], set[int],
                                                                                   str, list[str]]:
    """Steady root instances per root name, the first instances set apart, the rule in words."""
    instances: dict[str, list[int]] = defaultdict(list)
    for i in sorted({int(root[i]) for i in range(len(ranges)) if root[i] >= 0 and not warm[root[i]]},
                    key=lambda i: ranges[i].start):
        instances[ranges[i].name].append(i)
    first: set[int] = set()
    if warm.any():
        return instances, first, "kernels inside `warmup` ranges are left out", []
    rules, warnings = [], []
    for name, insts in instances.items():
        number = ranges[insts[0]].number
        if len(insts) >= 2 and number is not None and number > 1:
            rules.append(f"the first `{name}` range recorded is number {number}, not the program's first step: "
                         f"all {len(insts)} are measured")
        elif len(insts) >= 2:
            first.add(insts[0])
            rules.append(f"the first of {len(insts)} `{name}` ranges (compilation, allocation, autotuning) is "
                         f"reported apart as the first step; per-step figures are over the other {len(insts) - 1}")
        elif number is None or number <= 1:
            warnings.append(f"one `{name}` range and no `warmup` range: its figures include first-step costs "
                            "(compilation, allocation, autotuning); profile several steps")
    for name in instances:
        instances[name] = [i for i in instances[name] if i not in first]
    return instances, first, "no `warmup` range: " + "; ".join(rules) if rules else "no `warmup` range", warnings


def _categories(kt: KernelTable, inner: np.ndarray, bits: np.ndarray,
                library: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Category index per kernel (by name, then PHASE_RULES) and the rule that set it (-1: the name).
    `library`: each kernel's innermost library range and those ranges' PHASE_RULES bits (a
    rule's range may be a library's, FSDP's all-gather)."""
    base = np.array([_CAT[classify(n)] for n in kt.names], np.int8)[kt.name]
    cats, rule = base.copy(), np.full(len(kt), -1, np.int8)
    kbits = np.where(inner >= 0, bits[np.maximum(inner, 0)], 0)
    if library is not None:
        lib_inner, lib_bits = library
        kbits = kbits | np.where(lib_inner >= 0, lib_bits[np.maximum(lib_inner, 0)], 0)
    for j in reversed(range(len(PHASE_RULES))):  # the first rule that applies wins
        _, by_name, new = PHASE_RULES[j]
        hit = ((kbits >> j) & 1).astype(bool) & np.isin(base, [_CAT[c] for c in by_name])
        cats[hit], rule[hit] = _CAT[new], j
    return cats, rule


def program_ranges(profile: Profile) -> tuple[list[Range], str, str, list[Range]]:
    """The profile's ranges as the breakdown reads them: layer ranges left out (they label
    kernels, `harness.trace.analyses.layers`), library ranges set apart (no phases, no
    steps: `harness.trace.library_ranges`; a ``ProfilerStep`` inside the program's own step
    range is one too), numbered ranges as instances of one range, torch.profiler's last
    ProfilerStep dropped where it closed mid-iteration; with the two rules applied, in
    words ("" where none), and the library ranges."""
    own, library = [], []
    for r in profile.ranges:
        if not r.name.startswith(LAYER_RANGE_PREFIX):
            (library if library_of(r.name) else own).append(r)
    ranges, numbered = numbered_instances(own)
    parents = attr.range_parents(ranges)
    inside_step = [r.name.partition("#")[0] == PROFILER_STEP and _below_step(ranges, parents, i)
                   for i, r in enumerate(ranges)]
    library = sorted([*library, *(r for r, nested in zip(ranges, inside_step) if nested)],
                     key=lambda r: (r.start, -r.end))
    ranges, unclosed = open_profiler_step([r for r, nested in zip(ranges, inside_step) if not nested], profile.kernels)
    return ranges, numbered, unclosed, library


def _below_step(ranges: Sequence[Range], parents: np.ndarray, i: int) -> bool:
    """Whether range `i` lies inside a step range of the program's own (`step`, not ProfilerStep)."""
    p = parents[i]
    while p >= 0 and not (ranges[p].name in STEP_RANGES and ranges[p].name != PROFILER_STEP):
        p = parents[p]
    return p >= 0


def kernel_steps(kt: KernelTable, ranges: Sequence[Range], inner: np.ndarray, root: np.ndarray, warm: np.ndarray,
                 first: set[int], instances: Mapping[str, list[int]], tune: np.ndarray) -> dict[str, np.ndarray]:
    """Per kernel (boolean arrays, `kroot` its root range instance, -1 for none), from its
    innermost range `inner`: `warm` (in a warm-up range), `first` (in a first step set
    apart), `none` (in no range, or outside every root range), `only_first` (a name that ran
    only in the first steady instance of its root: setup, no per-step work, unless the
    profile began past the program's first steps, ProfilerStep#550) and `measured` (what the
    per-step figures count). `tune`: the autotuner's kernels, none of these."""
    safe = np.maximum(inner, 0)
    kroot = np.where(inner >= 0, root[safe], -1)
    kwarm = (inner >= 0) & warm[safe]
    kfirst = (kroot >= 0) & np.isin(kroot, list(first))
    none = ~tune & ((inner < 0) | (~kwarm & (kroot < 0)))
    measured = ~tune & ~none & ~kwarm & ~kfirst
    only_first = np.zeros(len(kt), bool)
    for insts in instances.values():
        if len(insts) >= 2 and (ranges[insts[0]].number or 0) <= 1:
            head = measured & (kroot == insts[0])
            later = kt.name[measured & np.isin(kroot, insts[1:])]
            only_first |= head & ~np.isin(kt.name, later)
    return {"kroot": kroot, "warm": kwarm, "first": kfirst, "none": none, "only_first": only_first,
            "measured": measured & ~only_first}


@dataclass
class Selection:
    """Which kernels a profile's per-step figures count, and why (`select`)."""

    ranges: list[Range]  # as the breakdown reads them (`program_ranges`)
    parents: np.ndarray  # per range: the innermost range holding it (-1: none)
    root: np.ndarray  # per range: its root (step) range (-1: none)
    warm: np.ndarray  # per range: inside a warm-up range
    first: set[int]  # root ranges set apart as the first step
    instances: dict[str, list[int]]  # per root name: its steady (measured) instances
    inner: np.ndarray  # per kernel: its innermost range by the chosen attribution (-1: none)
    cats: np.ndarray  # per kernel: category index
    rule: np.ndarray  # per kernel: the PHASE_RULES index that set its category (-1: its name)
    tune: np.ndarray  # per kernel: an autotuner's
    kernels: dict[str, np.ndarray]  # `kernel_steps`: kroot, warm, first, none, only_first, measured
    mode: str  # "execution" or "launch"
    reason: str
    outside: float
    moved: float | None
    steady_rule: str
    warnings: list[str]
    library: list[Range] = field(default_factory=list)  # library ranges: no phases, no steps (`program_ranges`)

    def measured_steps(self) -> list[Range]:
        """The measured step ranges (steady step instances) and every range inside one."""
        keep = {i for insts in self.instances.values() for i in insts if self.ranges[i].name in STEP_RANGES}
        return [r for i, r in enumerate(self.ranges) if self.root[i] in keep and not self.warm[i]]


def select(profile: Profile, attribution: str = "auto") -> Selection | None:
    """Attribute `profile`'s kernels to its ranges and mark those the per-step figures count
    (module docstring): by execution or by launch (`attribution`, "auto" choosing), the
    steady step instances, the first step set apart. None for a profile without ranges.
    The breakdown and every analysis that must count the same kernels (communication
    hidden under compute, collectives aligned across ranks) start here."""
    if attribution not in ATTRIBUTIONS:
        raise ProfileError(f"--attribution {attribution!r}: choose one of {', '.join(ATTRIBUTIONS)}")
    kt = profile.kernels
    ranges, numbered, unclosed, library = program_ranges(profile)
    if not ranges:
        return None
    parents = attr.range_parents(ranges)
    by_exec = attr.by_execution(kt, ranges)
    launches = attr.has_launches(kt)
    by_launch = attr.by_launch(kt, ranges) if launches else None
    warm, root, bits = _range_info(ranges, parents)
    cats, rule = _categories(kt, by_exec, bits)
    tune = cats == _CAT[Category.AUTOTUNING]
    outside, moved = attr.spill(np.where(tune, 0, kt.duration), by_exec, by_launch, ranges, kt)
    mode, reason = attr.choose(attribution, outside, moved, launches)
    # by launch, an activity whose launch is not in the profile belongs to no range: it was
    # asked for before the profile began (the previous step's tail), whenever it ran
    inner = by_exec if by_launch is None or mode == "execution" else by_launch
    lib = None
    if library:  # the kernels' innermost library ranges, by the same rule, for the rules they name
        lib_bits = _range_info(library, attr.range_parents(library))[2]
        lib_inner = attr.by_execution(kt, library) if by_launch is None or mode == "execution" else \
            attr.by_launch(kt, library)
        lib = (lib_inner, lib_bits)
    cats, rule = _categories(kt, inner, bits, lib)
    instances, first, steady_rule, warnings = _steady(ranges, warm, root)
    steady_rule = "; ".join(filter(None, (numbered, unclosed, steady_rule)))
    k = kernel_steps(kt, ranges, inner, root, warm, first, instances, tune)
    return Selection(ranges, parents, root, warm, first, dict(instances), inner, cats, rule, tune, k, mode,
                     reason, outside, moved, steady_rule, warnings, library)
