"""Each kernel's place in a profile: its innermost range, its step (root instance), whether
the per-step figures count it, its category and its layer.

`harness.trace.analyses.breakdown` sums kernels per phase; a timeline lays the same kernels
out one by one, so it needs the same decisions per kernel. `assign` takes them from the
breakdown's own selection (`harness.trace.analyses.selection.select`, under the attribution
rule the breakdown chose), so the measured kernels of a phase here add up to the
breakdown's figure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from harness.common.layer_names import LAYER_RANGE_PREFIX
from harness.trace.analyses.hlo_join import label_kernels
from harness.trace.analyses.layers import layer_labels, measured_layer_phases
from harness.trace.analyses.selection import _CAT, _categories, select
from harness.trace.kernels import Category
from harness.trace.profile import Profile, Range


@dataclass
class Assignment:
    """Per kernel of `profile.kernels` (arrays in its order) and per harness range."""

    ranges: list[Range]  # the profile's ranges without layer ranges; indices below refer to it
    inner: np.ndarray  # innermost range by the breakdown's rule (-1: none)
    root: np.ndarray  # the kernel's step: its root range instance (-1: none)
    measured: np.ndarray  # bool: counted in the per-step figures
    category: np.ndarray  # per kernel: index into list(Category)
    range_root: np.ndarray  # per range: its root range (-1: none)
    steps: dict[str, list[int]]  # root name -> its measured instances (range indices), in time order
    layers: np.ndarray | None  # per kernel: canonical layer (object array), where the profile records layers


def assign(profile: Profile, mode: str, schedules: Mapping | None = None) -> Assignment:
    """The breakdown's decisions per kernel; `mode` is the attribution the breakdown chose
    ("execution", "launch" or "none": no ranges, every kernel but the autotuner's is one step)."""
    kt = profile.kernels
    labels = layer_labels(kt, profile.ranges) if any(r.name.startswith(LAYER_RANGE_PREFIX)
                                                     for r in profile.ranges) else None
    sel = select(profile, mode) if mode != "none" else None
    if sel is None:
        cats, _ = _categories(kt, np.full(len(kt), -1, np.int64), np.zeros(1, np.int64))
        none = np.full(len(kt), -1, np.int64)
        return Assignment([], none, none, cats != _CAT[Category.AUTOTUNING], cats,
                          np.empty(0, np.int64), {}, labels)
    if labels is None and schedules is not None:
        labels = label_kernels(kt, measured_layer_phases(sel.ranges, sel.root, sel.warm, sel.first), schedules).labels
    return Assignment(sel.ranges, sel.inner, sel.kernels["kroot"], sel.kernels["measured"], sel.cats, sel.root,
                      dict(sel.instances), labels)
