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


def _hlo_ops(text: str, name: str) -> tuple[set[str], set[str]]:
    """An independent reading of what HLO instruction `name` computes: the last part of the
    op_names in the computations a fusion calls (nested fusions too, not a reduction's
    combining region), or its own, by regular expressions on the text; dot_general only from a
    dot or library call, output positions and relabelling left out, as the report describes
    kernels. Also the op_names themselves."""
    lines = {m.group(1): m.group(0) for m in re.finditer(r"^\s*(?:ROOT )?%?([\w.\-]+) = .*$", text, re.M)}
    bodies = {m.group(1): m.group(2) for m in re.finditer(r"^%?([\w.\-]+) \(.*?\) -> .*? \{\n(.*?)\n\}", text,
                                                          re.M | re.S)}
    pending, seen, found = re.findall(r" fusion\(.*calls=%?([\w.\-]+)", lines[name]), set(), []
    while pending:
        comp = pending.pop()
        if comp in seen:
            continue
        seen.add(comp)
        for line in bodies.get(comp, "").splitlines():
            if m := re.search(r'= \S+ ([\w-]+)\(.*op_name="([^"]*)"', line):
                found.append(m.groups())
            pending += re.findall(r" fusion\(.*calls=%?([\w.\-]+)", line)
    if not found and (m := re.search(r'= \S+ ([\w-]+)\(.*op_name="([^"]*)"', lines[name])):
        found = [m.groups()]
    def last(op_name: str) -> str:  # without the transforms' wrappers: jit(_take) -> _take
        part = op_name.split("/")[-1]
        while m := re.fullmatch(r"[\w\-]+\((.*)\)", part):
            part = m.group(1)
        return part

    prims = {last(op_name) for opcode, op_name in found
             if "[" not in last(op_name) and (last(op_name) != "dot_general" or opcode in ("dot", "custom-call", "convolution"))}
    return prims - {"broadcast_in_dim", "reshape", "squeeze", "expand_dims"}, {n for _, n in found}


def test_each_kernel_is_described_by_what_its_instructions_compute(captured) -> None:
    """The report's "XLA ops" for a kernel: the primitives of the instructions it ran as (kernel
    i of a phase is instruction i in this capture) and whether they are the backward's."""
    profile, ranges, join, _ = captured
    kt, schedules = profile.kernels, load_schedules(hlo_dir(SQLITE))
    texts = {phase: (hlo_dir(SQLITE) / f"{phase}.txt").read_text() for phase in PHASES}
    expected: dict[str, tuple[set[str], set[str]]] = defaultdict(lambda: (set(), set()))
    for phase in PHASES:
        for i, k in enumerate(kernels_in(kt, ranges[phase][0])):
            prims, op_names = _hlo_ops(texts[phase], schedules[phase][i].instruction.name)
            expected[kt.name_of(k)][0].update(prims)
            expected[kt.name_of(k)][1].update(op_names)
    checked = 0
    for name, (prims, op_names) in expected.items():
        text = join.ops.get(name, "")
        assert bool(text) == bool(prims), name
        if not text:
            continue
        dirs, listed = text.split(": ", 1)
        assert ("backward" in dirs) == any("transpose(" in n for n in op_names), (name, text)
        assert ("forward" in dirs) == any("transpose(" not in n for n in op_names), (name, text)
        if not listed.endswith(", ..."):
            assert set(listed.split(", ")) == prims, (name, text)
            checked += 1
    assert checked > 40
    # the SwiGLU's gate in this capture: silu (logistic, which XLA expands into neg, exp, add and
    # div) times w3's output
    assert any(text.startswith("ffn (forward): ") and {"neg", "exp", "div", "mul"} <= set(text.split(": ")[1].split(", "))
               for text in join.ops.values())


def test_the_report_names_each_top_kernel_s_ops(tmp_path) -> None:
    from harness import report

    out = tmp_path / "r"
    assert report.main([str(SQLITE), "--label", "jax", "--harness-json", str(DATA / "jax_layers.harness.json"),
                        "--out", str(out), "--no-plot"]) == 0
    md = (out / "kernels.md").read_text()
    table = md[md.index("## jax: top kernels"):]
    table = table[table.index("### forward"):]
    header = next(line for line in table.splitlines() if line.startswith("| kernel"))
    assert header.endswith("| share | XLA ops |")
    doc = json.loads((out / "kernels.json").read_text())
    kernels = [k for k in doc[0]["phases"]["forward"]["kernels"] if not k["name"].startswith("[CUDA")]
    # a fusion that only moves a matmul's output (a transpose XLA added) names no primitive
    described = sum(k["ns_per_step"] for k in kernels if k.get("ops")) / sum(k["ns_per_step"] for k in kernels)
    assert described > 0.8
