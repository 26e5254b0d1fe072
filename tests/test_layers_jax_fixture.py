"""JAX layer attribution on a real profile: kernels of `harness.run --backend jax
--layer-ranges` under nsys joined to the optimized HLO that run wrote.

Fixture (tests/data/layers/, captured by tests/data/layers/capture_jax.sh on a GPU):
jax_layers.sqlite.gz, jax_layers.harness.json, jax_layers.hlo/<phase>.txt.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from harness.trace.analyses.hlo_join import (
    HOW_IGNORED,
    HOW_NONE,
    OUTSIDE,
    hlo_dir,
    join_kernels,
    kernels_in,
    label_kernels,
    load_schedules,
)
from harness.trace.sources.nsys import read_sqlite

DATA = Path(__file__).parent / "data" / "layers"
SQLITE = DATA / "jax_layers.sqlite.gz"
PHASES = ("forward", "backward")
pytestmark = pytest.mark.skipif(not SQLITE.exists(), reason="fixture not captured yet (tests/data/layers/capture_jax.sh)")


@pytest.fixture(scope="module")
def captured():
    profile = read_sqlite(SQLITE)
    steps = [r for r in profile.ranges if r.name == "step"]
    # the measured steps' phases (warm-up phases hold compilation and autotuning)
    ranges = {phase: [r for r in profile.ranges if r.name == phase
                      and any(s.start <= r.start and r.end <= s.end for s in steps)] for phase in PHASES}
    assert all(len(v) == len(steps) > 0 for v in ranges.values())
    join = label_kernels(profile.kernels, ranges, load_schedules(hlo_dir(SQLITE)))
    doc = json.loads((DATA / "jax_layers.harness.json").read_text())
    return profile, ranges, join, doc


# The fixture's phases run one kernel per schedule item on one stream: every kernel joins
# its own instruction (by position, and by alignment when the positions do not line up).
COVERAGE = {"forward": 1.0, "backward": 1.0}


def test_coverage_of_each_phase(captured) -> None:
    _, _, join, _ = captured
    for phase in PHASES:
        assert join.coverage[phase] >= COVERAGE[phase], f"{phase}: {join.coverage[phase]:.1%} of GPU time joined"


def test_each_kernel_joins_its_own_instruction(captured) -> None:
    """This capture ran one stream, so its kernels are its schedule's launches in order, one
    each: kernel i must join instruction i, whatever name a reused fusion's kernel bears."""
    profile, ranges, _, _ = captured
    kt, schedules = profile.kernels, load_schedules(hlo_dir(SQLITE))
    for phase in PHASES:
        for r in ranges[phase]:
            idx = kernels_in(kt, r)
            assert len(idx) == len(schedules[phase])
            join = join_kernels([kt.name_of(i) for i in idx], kt.kind[idx], schedules[phase])
            assert not np.any(join.how == HOW_IGNORED)
            assert np.array_equal(join.item, np.arange(len(idx))), phase


def test_per_layer_sums_equal_phase_totals(captured) -> None:
    profile, ranges, join, doc = captured
    kt = profile.kernels
    num_layers = doc["config"]["num_layers"]
    vocabulary = {OUTSIDE, "token_embeddings", "ln_final", "lm_head", "loss",
                  *(f"layers.{i}.{p}" for i in range(num_layers) for p in ("ln1", "attn", "ln2", "ffn"))}
    for phase in PHASES:
        idx = np.concatenate([kernels_in(kt, r) for r in ranges[phase]])
        per_layer: dict[str, int] = defaultdict(int)
        for i in idx:
            per_layer[join.labels[i]] += int(kt.duration[i])
        assert set(per_layer) <= vocabulary
        assert sum(per_layer.values()) == int(kt.duration[idx].sum())
        # the float32 -> bf16 weight casts and the output copies
        assert per_layer[OUTSIDE] < 0.4 * sum(per_layer.values())


def test_planted_wide_block_takes_the_most_time(captured) -> None:
    profile, ranges, join, doc = captured
    wide = next((v for k, v in doc["config"].items() if "wide" in k and isinstance(v, int)), None)
    if wide is None:
        pytest.skip("the fixture's model has no planted wide layer")
    kt = profile.kernels
    blocks: dict[int, int] = defaultdict(int)
    for phase in PHASES:
        for i in np.concatenate([kernels_in(kt, r) for r in ranges[phase]]):
            if m := re.match(r"layers\.(\d+)\.", join.labels[i]):
                blocks[int(m.group(1))] += int(kt.duration[i])
    assert max(blocks, key=blocks.get) == wide, blocks
    ffn = {phase: {b: sum(int(kt.duration[i]) for r in ranges[phase] for i in kernels_in(kt, r)
                         if join.labels[i] == f"layers.{b}.ffn") for b in blocks} for phase in PHASES}
    for phase, per_block in ffn.items():  # its FFN stands out against the other block's
        assert all(per_block[wide] > 1.5 * v for b, v in per_block.items() if b != wide), (phase, per_block)


def test_positional_join_leaves_a_foreign_kernel_unjoined(captured) -> None:
    """One kernel renamed to a family no instruction has: the sequence still lines up, so the
    join stays positional, labels every other kernel as before and leaves that one unjoined;
    one kernel fewer breaks the one-to-one order and the alignment takes over."""
    profile, ranges, join, _ = captured
    kt = profile.kernels
    idx = kernels_in(kt, ranges["forward"][0])
    names = [kt.name_of(i) for i in idx]
    items = load_schedules(hlo_dir(SQLITE))["forward"]
    fusion = next(i for i, it in enumerate(items) if it.kind == "anchor" and it.layer.endswith(".ffn"))
    names[fusion] = "unrelated_kernel_name"
    planted = join_kernels(names, kt.kind[idx], items)
    assert planted.how[fusion] == HOW_NONE and planted.labels[fusion] == OUTSIDE
    others = [i for i in range(len(idx)) if i != fusion]
    assert [planted.labels[i] for i in others] == [join.labels[idx[i]] for i in others]
    assert (np.delete(planted.how, fusion) != HOW_NONE).all()
    # one kernel fewer: the order no longer lines up one to one, the alignment takes over and
    # places every remaining kernel as the positional join did
    shorter = join_kernels(names[:-1], kt.kind[idx][:-1], items)
    assert [shorter.labels[i] for i in others[:-1]] == [planted.labels[i] for i in others[:-1]]
