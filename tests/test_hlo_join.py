"""JAX layer attribution on CPU: named scopes in real XLA HLO, the HLO parser, and the
kernel-to-schedule join on kernel sequences built from a real parsed schedule."""

from __future__ import annotations

import contextlib
import itertools
import json
import random
import re

import jax
import numpy as np
import pytest

from harness.backends.jax.session import JaxSession
from harness.common.layer_names import canonical_layer
from harness.config import get_config
from harness.timing.tokens import make_tokens
from harness.trace.analyses import hlo_join
from harness.trace.analyses.hlo_join import (
    HOW_ANCHOR,
    HOW_GAP,
    HOW_IGNORED,
    HOW_NONE,
    OUTSIDE,
    Instruction,
    ScheduleItem,
    join_kernels,
    kernel_name,
    label_kernels,
    parse_hlo,
    schedule,
    scope_path,
)
from harness.trace.analyses.seq_align import WINDOW, align
from harness.trace.profile import KERNEL, MEMCPY, MEMSET, Kernel, KernelTable, Range

CONFIG = get_config("tiny")  # 2 layers
LAYERS = {"token_embeddings", "ln_final", "lm_head", "loss",
          *(f"layers.{i}.{part}" for i in range(CONFIG.num_layers) for part in ("ln1", "attn", "ln2", "ffn"))}
# A cuBLAS kernel name as XLA's GPU profiles show it for a GEMM custom call.
CUBLAS = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"


def _session() -> JaxSession:
    return JaxSession(CONFIG, make_tokens(CONFIG.vocab_size, 2, 16, 0), device="cpu", dtype="fp32", seed=0)


@pytest.fixture(scope="module")
def hlo() -> dict[str, str]:
    return _session().optimized_hlo()


@pytest.fixture(scope="module")
def schedules(hlo) -> dict[str, list[ScheduleItem]]:
    return {phase: schedule(parse_hlo(hlo[phase])) for phase in ("forward", "backward")}


def test_canonical_layer_dotted_and_slashed() -> None:
    assert canonical_layer("layers.3.attn.q_proj") == "layers.3.attn"
    assert canonical_layer("layers/3/attn") == "layers.3.attn"
    assert canonical_layer("f/layers.12/ffn/dot_general") == "layers.12.ffn"
    assert canonical_layer("step/lm_head/dot_general") == "lm_head"
    assert canonical_layer("layers.3/add") is None  # the residual add: inside a block, in no sub-module
    assert canonical_layer("jit(_loss_fn)/mul") is None  # "loss" only as a whole scope name


def test_scope_path_peels_transforms() -> None:
    assert scope_path("jit(step)/transpose(jvp(layers.3))/attn/dot_general") == "step/layers.3/attn/dot_general"
    assert hlo_join.op_layer("jit(f)/jvp(layers.0)/ln2/mul") == "layers.0.ln2"
    assert hlo_join.op_layer("jit(f)/transpose(jvp(loss))/jit(log_softmax)/div") == "loss"


@pytest.mark.parametrize("phase, marker", [("forward", "jvp(layers.1)/ffn"), ("backward", "transpose(jvp(layers.1))/ffn")])
def test_named_scopes_reach_the_compiled_hlo(hlo, schedules, phase: str, marker: str) -> None:
    op_names = re.findall(r'op_name="([^"]*)"', hlo[phase])
    assert any(marker in n for n in op_names)
    found = {hlo_join.op_layer(n) for n in op_names} - {None}
    assert found == LAYERS
    # Every layer's work is in the schedule, as the label of some launching instruction.
    assert {item.layer for item in schedules[phase]} - {OUTSIDE} == LAYERS


def _strip_metadata(text: str) -> list[str]:
    body = text[text.index("\n%"):]  # drop the header's file and stack-frame tables
    return [re.sub(r", metadata=\{[^}]*\}", "", line) for line in body.splitlines()]


def test_named_scopes_change_nothing_but_metadata(hlo, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jax, "named_scope", lambda name: contextlib.nullcontext())
    s = _session()
    plain = s._fwd.lower(s.state, s.inputs, s.targets).compile().as_text()
    assert "layers.0" not in plain and "layers.0" in hlo["forward"]
    assert _strip_metadata(plain) == _strip_metadata(hlo["forward"])


def test_parse_real_hlo(hlo) -> None:
    module = parse_hlo(hlo["backward"])
    assert module.scheduled and module.entry in module.computations
    entry = module.computations[module.entry]
    fusions = [i for i in entry if i.opcode == "fusion"]
    assert fusions and all(i.fusion_kind and i.calls and i.calls[0] in module.computations for i in fusions)
    dots = [i for i in entry if i.opcode == "dot"]
    assert dots and all("transpose(jvp(layers." in i.op_name for i in dots)
    with pytest.raises(ValueError, match="HloModule"):
        parse_hlo("not hlo")


def test_fusion_layer_is_the_majority_of_its_fused_ops() -> None:
    text = """HloModule m, is_scheduled=true

%fused (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  %a = f32[4]{0} add(%p, %p), metadata={op_name="jit(f)/transpose(jvp(loss))/add_any"}
  %b = f32[4]{0} multiply(%a, %p), metadata={op_name="jit(f)/transpose(jvp(layers.3))/attn/mul"}
  ROOT %c = f32[4]{0} multiply(%b, %b), metadata={op_name="jit(f)/transpose(jvp(layers.3))/attn/mul"}
}

ENTRY %main (x: f32[4]) -> f32[4] {
  %x = f32[4]{0} parameter(0)
  %loop_multiply_fusion.2 = f32[4]{0} fusion(f32[4]{0} %x), kind=kLoop, calls=%fused, metadata={op_name="jit(f)/transpose(jvp(loss))/add_any" deduplicated_name="loop_multiply_fusion" scheduling_name="loop_multiply_fusion.2"}
  ROOT %cublas-gemm.1 = (f32[4]{0}, s8[8]{0}) custom-call(f32[4]{0} %loop_multiply_fusion.2), custom_call_target="__cublas$gemm", metadata={op_name="jit(f)/jvp(lm_head)/dot_general"}
}
"""
    items = schedule(parse_hlo(text))
    assert [(i.kind, i.layer) for i in items] == [("anchor", "layers.3.attn"), ("call", "lm_head")]
    fusion = items[0].instruction
    assert (fusion.deduplicated_name, fusion.scheduling_name) == ("loop_multiply_fusion", "loop_multiply_fusion.2")
    assert items[0].kernel_names == {"loop_multiply_fusion", "loop_multiply_fusion_2"}
    assert items[1].instruction.custom_call_target == "__cublas$gemm"


def _kernels(items: list[ScheduleItem]) -> tuple[list[str], list[int], list[str]]:
    """The kernels XLA's GPU runtime would launch for `items`: a fusion's kernel named after
    it ('.' as '_'), a cuBLAS kernel per call, a memcpy per copy; and each one's layer."""
    anchor = lambda it: kernel_name(it.instruction.deduplicated_name or it.instruction.name)
    names = [anchor(it) if it.kind == "anchor" else CUBLAS if it.kind == "call" else "[CUDA memcpy]" for it in items]
    kinds = [MEMCPY if it.kind == "copy" else KERNEL for it in items]
    return names, kinds, [it.layer for it in items]


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_join_labels_every_kernel_of_a_faithful_sequence(schedules, phase: str) -> None:
    items = schedules[phase]
    names, kinds, truth = _kernels(items)
    join = join_kernels(names, kinds, items)
    assert join.labels == truth
    assert np.all((join.how == HOW_ANCHOR) | (join.how == HOW_GAP))
    assert np.array_equal(join.item, np.arange(len(items)))


def _anchor_between_anchors(items: list[ScheduleItem], layer_changes: bool = False) -> int:
    for i in range(1, len(items) - 1):
        if all(items[j].kind == "anchor" for j in (i - 1, i, i + 1)):
            if not layer_changes or items[i].layer != items[i + 1].layer:
                return i
    raise AssertionError("no anchor between anchors in the schedule")


def test_planted_mismatch_lowers_coverage_and_mislabels_nothing(schedules) -> None:
    items = schedules["backward"]
    names, kinds, truth = _kernels(items)
    foreign = _anchor_between_anchors(items)
    names[foreign] = "mystery_kernel"  # a kernel the HLO knows nothing of
    far = next(i for i in range(len(items)) if items[i].kind == "anchor" and i > foreign + 3 * WINDOW)
    moved = next(i for i in range(len(items)) if items[i].kind == "anchor" and i > far + 3 * WINDOW
                 and kernel_name(items[i].instruction.name) not in items[far].kernel_names)
    names[moved] = names[far]  # an anchor's name, far from where that anchor runs
    join = join_kernels(names, kinds, items)
    assert join.how[foreign] == HOW_NONE and join.labels[foreign] == OUTSIDE
    assert join.how[moved] == HOW_NONE and join.labels[moved] == OUTSIDE
    joined = np.flatnonzero(join.how != HOW_NONE)
    assert len(joined) == len(items) - 2
    assert all(join.labels[k] == truth[k] for k in joined)


def test_reordered_neighbours_and_a_missing_kernel(schedules) -> None:
    items = schedules["forward"]
    names, kinds, truth = _kernels(items)
    i = _anchor_between_anchors(items, layer_changes=True)
    names[i], names[i + 1] = names[i + 1], names[i]  # concurrent graph nodes starting out of order
    truth[i], truth[i + 1] = truth[i + 1], truth[i]
    gone = _anchor_between_anchors(items[i + 5:]) + i + 5
    del names[gone], kinds[gone], truth[gone]
    join = join_kernels(names, kinds, items)
    assert join.labels == truth
    assert np.all(join.how != HOW_NONE)


def _item(kind: str, layer: str, name: str) -> ScheduleItem:
    names = frozenset({kernel_name(name)}) if kind == "anchor" else frozenset()
    return ScheduleItem(Instruction(name, "fusion" if kind == "anchor" else "custom-call"), kind, layer, names)


def test_gap_kernels_join_only_where_unambiguous() -> None:
    items = [_item("anchor", "layers.0.attn", "loop_fusion.1"), _item("call", "layers.0.attn", "cublas-gemm.1"),
             _item("call", "layers.0.ffn", "cublas-gemm.2"), _item("anchor", "layers.0.ffn", "loop_fusion.2"),
             _item("call", "layers.1.attn", "cublas-gemm.3"), _item("call", "layers.1.attn", "cublas-gemm.4"),
             _item("anchor", "layers.1.ffn", "loop_fusion.3")]
    # two calls of two layers, two kernels: one each; three kernels there would be ambiguous
    join = join_kernels(["loop_fusion_1", CUBLAS, CUBLAS, "loop_fusion_2", "splitKreduce_kernel", CUBLAS, CUBLAS,
                         "[CUDA memset]", "loop_fusion_3"], [KERNEL] * 7 + [MEMSET, KERNEL], items)
    assert join.labels == ["layers.0.attn", "layers.0.attn", "layers.0.ffn", "layers.0.ffn", "layers.1.attn",
                           "layers.1.attn", "layers.1.attn", OUTSIDE, "layers.1.ffn"]
    assert join.how[7] == HOW_IGNORED
    join = join_kernels(["loop_fusion_1", CUBLAS, CUBLAS, CUBLAS, "loop_fusion_2"], [KERNEL] * 5, items)
    assert join.labels[1:4] == [OUTSIDE] * 3 and np.all(join.how[1:4] == HOW_NONE)


def test_label_kernels_per_phase_coverage(schedules) -> None:
    items = schedules["forward"]
    names, kinds, truth = _kernels(items)
    foreign = _anchor_between_anchors(items)
    names[foreign] = "mystery_kernel"
    dur = [1000 + 37 * i for i in range(len(names))]
    t, kernels = 10_000, []
    for _ in range(2):
        for name, d in zip(names, dur):
            kernels.append(Kernel(name, t, t + d))
            t += d + 100
        t += 50_000
    kernels.append(Kernel("RedzoneAllocatorKernelImpl", t, t + 5000))  # outside every range
    table = KernelTable.from_kernels(kernels)
    per_step = t // 2
    ranges = [Range("forward", 9_000, per_step), Range("forward", per_step, t)]
    join = label_kernels(table, {"forward": ranges}, {"forward": items})
    total = 2 * sum(dur)
    assert join.coverage["forward"] == pytest.approx((total - 2 * dur[foreign]) / total)
    assert join.ignored["forward"] == 0.0
    assert list(join.labels[:len(names)]) == [OUTSIDE if k == foreign else truth[k] for k in range(len(names))]
    assert join.labels[-1] == OUTSIDE
    # per-layer sums add up to the phase's GPU time
    inside = table.end <= t
    sums = {label: int(table.duration[inside & (join.labels == label)].sum()) for label in set(join.labels)}
    assert sum(sums.values()) == total
    with pytest.raises(ValueError, match="no optimized HLO for phase 'backward'"):
        label_kernels(table, {"backward": ranges}, {"forward": items})


def test_hlo_files_written_and_read_back(tmp_path) -> None:
    s = _session()
    paths = s.write_hlo(hlo_join.hlo_dir(tmp_path / "jax_layers.harness.json"))
    assert set(paths) == {"forward", "backward", "optimizer", "fused_step"}
    assert all(p.startswith(str(tmp_path / "jax_layers.hlo")) for p in paths.values())
    loaded = hlo_join.load_schedules(tmp_path / "jax_layers.hlo")
    assert {it.layer for it in loaded["backward"]} - {OUTSIDE} == LAYERS
    with pytest.raises(FileNotFoundError, match="--layer-ranges"):
        hlo_join.load_schedules(tmp_path)


REUSE_HLO = """HloModule m, is_scheduled=true

%t0 (p: bf16[4,8]) -> bf16[8,4] {
  %p = bf16[4,8]{1,0} parameter(0)
  ROOT %transpose.7 = bf16[8,4]{1,0} transpose(%p), dimensions={1,0}
}

%t1 (q: bf16[4,8]) -> bf16[8,4] {
  %q = bf16[4,8]{1,0} parameter(0)
  ROOT %transpose.9 = bf16[8,4]{1,0} transpose(%q), dimensions={1,0}, metadata={op_name="jit(f)/x"}
}

%n0 (r: bf16[4,8]) -> bf16[4,8] {
  %r = bf16[4,8]{1,0} parameter(0)
  ROOT %negate.1 = bf16[4,8]{1,0} negate(%r)
}

ENTRY %main (x: bf16[4,8]) -> bf16[4,8] {
  %x = bf16[4,8]{1,0} parameter(0)
  %wrapped_transpose = bf16[8,4]{1,0} fusion(%x), kind=kLoop, calls=%t0
  %wrapped_transpose.1 = bf16[8,4]{1,0} fusion(%x), kind=kLoop, calls=%t1
  %gemm_fusion_dot.75 = bf16[4,8]{1,0} fusion(%x), kind=kLoop, calls=%n0, metadata={op_name="jit(f)/jvp(layers.1)/attn/dot_general" deduplicated_name="gemm_fusion_dot.62"}
  %gemm_fusion_dot.72 = bf16[4,8]{1,0} fusion(%x), kind=kLoop, calls=%n0, metadata={op_name="jit(f)/jvp(layers.1)/attn/dot_general" deduplicated_name="gemm_fusion_dot.62"}
  %gemm_fusion_dot.62 = bf16[4,8]{1,0} fusion(%x), kind=kLoop, calls=%n0, metadata={op_name="jit(f)/jvp(layers.0)/attn/dot_general" deduplicated_name="gemm_fusion_dot.62"}
  ROOT %wrapped_negate = bf16[4,8]{1,0} fusion(%x), kind=kLoop, calls=%n0
}
"""


def test_reused_kernels_bear_any_name_of_their_class() -> None:
    """XLA names a reused kernel after the first fusion of its class it emitted, here
    gemm_fusion_dot.75 for all three of gemm_fusion_dot.62's class; fusions with identical
    bodies and no deduplicated_name (the wrapped transposes) are reused alike."""
    items = schedule(parse_hlo(REUSE_HLO))
    dot_class = {"gemm_fusion_dot_62", "gemm_fusion_dot_72", "gemm_fusion_dot_75"}
    assert [set(it.kernel_names) for it in items] == [{"wrapped_transpose", "wrapped_transpose_1"}] * 2 + \
        [dot_class] * 3 + [{"wrapped_negate"}]  # same body as the dots', but another class
    join = join_kernels(["wrapped_transpose", "wrapped_transpose", *["gemm_fusion_dot_75"] * 3, "wrapped_negate"],
                        [KERNEL] * 6, items)
    assert np.array_equal(join.item, np.arange(6))
    assert join.labels[2:5] == ["layers.1.attn", "layers.1.attn", "layers.0.attn"]


def test_a_missing_reused_kernel_leaves_its_run_unlabelled() -> None:
    """Two anchors of one class in two layers and one kernel of it: which one ran is not
    known between the same neighbours, and known where a neighbour sits between them."""
    x = frozenset({"dot_fusion"})
    a, b = _item("anchor", "layers.0.ln1", "loop_fusion.1"), _item("anchor", "layers.1.ln1", "loop_fusion.2")
    x0 = ScheduleItem(Instruction("dot_fusion.1", "fusion"), "anchor", "layers.0.attn", x)
    x1 = ScheduleItem(Instruction("dot_fusion.2", "fusion"), "anchor", "layers.1.attn", x)
    kernels = ["loop_fusion_1", "dot_fusion", "loop_fusion_2"]
    join = join_kernels(kernels, [KERNEL] * 3, [a, x0, x1, b])
    assert join.labels == ["layers.0.ln1", OUTSIDE, "layers.1.ln1"] and join.how[1] == HOW_NONE
    join = join_kernels(kernels, [KERNEL] * 3, [a, x0, b, x1])
    assert join.labels == ["layers.0.ln1", "layers.0.attn", "layers.1.ln1"]


def _optimal_matchings(accepts: list[np.ndarray], m: int) -> list[tuple[int, ...]]:
    """Every longest order-preserving matching of kernels to anchors, by enumeration."""
    found = []
    for choice in itertools.product(*[[-1, *acc.tolist()] for acc in accepts]):
        used = [a for a in choice if a >= 0]
        if all(x < y for x, y in zip(used, used[1:])):
            found.append(choice)
    best = max(sum(a >= 0 for a in c) for c in found)
    return [c for c in found if sum(a >= 0 for a in c) == best]


def test_alignment_against_enumerated_matchings() -> None:
    rng = random.Random(7)
    for _ in range(200):
        n, m = rng.randint(1, 6), rng.randint(1, 6)
        accepts = [np.array(sorted(rng.sample(range(m), rng.randint(0, min(m, 3)))), np.int64) for _ in range(n)]
        optimal = _optimal_matchings(accepts, m)
        one_layer = align(accepts, m, np.zeros(m, np.int64))
        assert tuple(one_layer.tolist()) in optimal  # one longest matching, kept whole
        per_anchor = align(accepts, m, np.arange(m))  # a layer per anchor: kept where all agree
        for i in range(n):
            anchors = {c[i] for c in optimal if c[i] >= 0}
            assert per_anchor[i] in ({one_layer[i]} if len(anchors) == 1 else {-1})


def test_jax_run_with_layer_ranges_writes_the_hlo_beside_its_result(tmp_path) -> None:
    """harness.run --backend jax --layer-ranges --out X.json writes X.hlo/<phase>.txt, records
    the folder by name (no absolute path), and the files parse into scheduled phases whose
    fusions carry the model's layers."""
    from harness import run

    out = tmp_path / "jax_tiny.json"
    code = run.main(["--backend", "jax", "--model", "tiny", "--ctx", "16", "--batch", "2", "--device", "cpu",
                     "--warmup", "1", "--steps", "2", "--layer-ranges", "--quiet", "--out", str(out)])
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["layer_ranges"]["hlo"] == {"folder": "jax_tiny.hlo",
                                         "phases": ["backward", "forward", "fused_step", "optimizer"]}
    assert "hlo_dir" not in doc["options"] and str(tmp_path) not in out.read_text()
    schedules = hlo_join.load_schedules(hlo_join.hlo_dir(out))
    layers = {item.layer for item in schedules["forward"]}
    assert {"token_embeddings", "layers.0.attn", "layers.1.ffn", "lm_head", "loss"} <= layers


def test_the_second_step_compiles_nothing() -> None:
    """Each phase compiles on its first call only: the split step's second run, and a fused
    step after split steps, hand every program inputs it has seen (the optimizer state's
    leaves all committed to the device, as each update returns them), and so do the moves
    of the state between the fused step's one-array layout and the split step's arrays."""
    from harness.timing.events import EventLog

    s = _session()

    def split_step() -> None:
        s.forward()
        s.backward()
        s.sync(s.optimizer_step())

    split_step()
    s.sync(s.fused_step())
    split_step()
    with EventLog("jax.monitoring") as log:
        s.sync(s.fused_step())
        split_step()
        s.sync(s.fused_step())
    assert [e.detail for e in log.events if e.kind == "compile"] == []
