"""Layer attribution: the NVTX layer ranges from module hooks nest as the modules do in the
forward and in a backward run on another thread, canonical names from both frameworks'
paths, per-layer totals against a hand count, the diff's layer table, and a planted wide
block that comes out as the most expensive layer."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torch_impl
from harness import run as run_cli
from harness.backends import ranges
from harness.backends.torch.session import TorchSession
from harness.common.layer_names import canonical_layer
from harness.config import get_config
from harness.diffs.decompose import diff_runs
from harness.diffs.inputs import Run
from harness.diffs.layers import largest_moves
from harness.reports.diff import diff_markdown, to_json
from harness.timing.plants import wide_block
from harness.timing.tokens import make_tokens
from harness.trace.analyses.layers import OUTSIDE, layer_kind, layer_labels, layer_totals
from harness.trace.profile import Kernel, KernelTable, Range

CANONICAL = {"token_embeddings", "ln_final", "lm_head", "loss",
             *(f"layers.{i}.{s}" for i in range(2) for s in ("ln1", "attn", "ln2", "ffn"))}


class Recorder:
    """Stands in for the nvtx module: records (thread, "push"/"pop", text, time)."""

    def __init__(self) -> None:
        self.events: list[tuple[int, str, str | None, int]] = []

    def push_range(self, text: str) -> None:
        self.events.append((threading.get_ident(), "push", text, time.perf_counter_ns()))

    def pop_range(self) -> None:
        self.events.append((threading.get_ident(), "pop", None, time.perf_counter_ns()))


def _session(monkeypatch, **overrides) -> tuple[TorchSession, Recorder]:
    recorder = Recorder()
    monkeypatch.setattr(ranges, "nvtx", recorder)
    config = get_config("tiny", **overrides)
    session = TorchSession(config, make_tokens(config.vocab_size, 2, 32, 0), device="cpu", dtype="fp32", seed=0)
    ranges.install_layer_ranges(session.layer_modules())
    return session, recorder


def _intervals(events) -> list[tuple[str, int, int, int]]:
    """(text, depth, start, end) per range of one thread's events; asserts they balance."""
    stack, out = [], []
    for _, kind, text, t in events:
        if kind == "push":
            stack.append((text, len(stack), t))
        else:
            assert stack, "pop without a push"
            name, depth, t0 = stack.pop()
            out.append((name, depth, t0, t))
    assert not stack, f"unclosed ranges {stack}"
    return out


def _paths(intervals, depth: int) -> list[str]:
    return [name.removeprefix("layer:") for name, d, t0, _ in sorted(intervals, key=lambda x: x[2]) if d == depth]


def test_ranges_nest_in_forward_and_in_a_backward_on_another_thread(monkeypatch) -> None:
    session, rec = _session(monkeypatch)
    session.forward()
    main = threading.get_ident()
    forward = list(rec.events)
    worker = threading.Thread(target=session.backward)
    worker.start()
    worker.join()
    backward = rec.events[len(forward):]
    assert {e[0] for e in forward} == {main}
    assert {e[0] for e in backward} == {worker.ident} and worker.ident != main
    blocks = ["layers.0", "layers.1"]
    subs = lambda i: [f"layers.{i}.{s}" for s in ("ln1", "attn", "ln2", "ffn")]  # noqa: E731
    fwd, bwd = _intervals(forward), _intervals(backward)
    assert _paths(fwd, 0) == ["token_embeddings", *blocks, "ln_final", "lm_head", "loss"]
    assert _paths(fwd, 1) == [*subs(0), *subs(1)]
    # The backward visits the modules in reverse, sub-modules inside their block.
    assert _paths(bwd, 0) == ["loss", "lm_head", "ln_final", *blocks[::-1], "token_embeddings"]
    assert _paths(bwd, 1) == [*subs(1)[::-1], *subs(0)[::-1]]
    for phase in (fwd, bwd):
        for name, depth, t0, t1 in phase:
            if depth == 1:  # inside its block's range
                assert any(b[0] == name.rsplit(".", 1)[0] and b[2] <= t0 and t1 <= b[3] for b in phase), name


class Ops(TorchDispatchMode):
    """Records each aten op into the recorder's event stream, so ops sit between pushes and pops."""

    def __init__(self, rec: Recorder) -> None:
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.rec.events.append((threading.get_ident(), "op", str(func), 0))
        return func(*args, **(kwargs or {}))


def test_backward_ops_run_inside_their_module_s_range(monkeypatch) -> None:
    """The embedding's gradient (index_put) and every matmul of a layer's backward fall in
    its range; a block's range holds no op of its own: the sum of a residual connection's
    gradient with its norm's runs inside the norm's range, just before the norm's input
    node (one add more than the norm's own backward has)."""
    session, rec = _session(monkeypatch)
    session.forward()
    n = len(rec.events)
    with Ops(rec):
        session.backward()
    stack, where = [], {}
    for _, kind, text, _ in rec.events[n:]:
        if kind == "push":
            stack.append(text.removeprefix("layer:"))
        elif kind == "pop":
            stack.pop()
        elif not text.startswith(("aten.view", "aten.t.", "aten.detach", "aten._unsafe_view", "aten.transpose",
                                  "aten.expand", "aten.ones_like")):
            where.setdefault(stack[-1] if stack else None, []).append(text)
    assert "aten.index_put.default" in where["token_embeddings"]
    assert where["lm_head"].count("aten.mm.default") == 2  # grad of input and of weight
    assert where["layers.1.ffn"].count("aten.mm.default") == 4  # w1 and w3 as one matmul, and w2
    assert "layers.0" not in where and "layers.1" not in where
    for i in range(2):
        for norm in ("ln1", "ln2"):
            assert where[f"layers.{i}.{norm}"].count("aten.add.Tensor") == 2, (i, norm)
    assert where["ln_final"].count("aten.add.Tensor") == 1  # its input has no other use
    assert "aten.nll_loss_backward.default" in where["loss"]
    assert None not in where


def _graph_nodes(root) -> int:
    """The number of autograd nodes reachable from `root`."""
    seen, todo = set(), [root]
    while todo:
        node = todo.pop()
        if node is not None and node not in seen:
            seen.add(node)
            todo += [n for n, _ in node.next_functions]
    return len(seen)


def _forward(session: TorchSession):
    session.forward()
    return session._loss.grad_fn


def test_backward_ranges_add_no_autograd_node(monkeypatch) -> None:
    """The ranges hook the nodes the forward makes anyway: the graph has as many nodes
    with them as without (full backward hooks add an autograd function on each side of most modules)."""
    monkeypatch.setattr(ranges, "nvtx", Recorder())
    config = get_config("tiny")
    session = TorchSession(config, make_tokens(config.vocab_size, 2, 32, 0), device="cpu", dtype="fp32", seed=0)
    bare = _graph_nodes(_forward(session))
    handles = ranges.install_layer_ranges(session.layer_modules())
    assert _graph_nodes(_forward(session)) == bare > 50
    for h in handles:
        h.remove()
    modules = session.layer_modules()
    for module in modules.values():
        module.register_full_backward_pre_hook(lambda *a: None)
        module.register_full_backward_hook(lambda *a: None)
    assert _graph_nodes(_forward(session)) > bare + len(modules)  # what full backward hooks add


class _Twice(torch.nn.Module):
    """Returns its child's output as its own; its child reads two activations."""

    def __init__(self) -> None:
        super().__init__()
        self.child = _Pair()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.child(a, b)


class _Pair(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(3))

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * self.w + b.exp()


def test_shared_outputs_two_inputs_and_identities_nest(monkeypatch) -> None:
    """A module returning its child's output opens before the child and closes after it; a
    module with two inputs closes once both gradients are in; an identity module and a
    module called without grad get forward ranges only."""
    rec = Recorder()
    monkeypatch.setattr(ranges, "nvtx", rec)
    outer, ident = _Twice(), torch.nn.Identity()
    ranges.install_layer_ranges({"outer": outer, "outer.child": outer.child, "ident": ident})
    x = torch.ones(3, requires_grad=True)
    a, b = x * 2, x * 3
    with torch.no_grad():
        outer(a, b)
    out = ident(outer(a, b)).sum()
    n = len(rec.events)
    with Ops(rec):
        out.backward()
    events = [(kind, text) for _, kind, text, _ in rec.events[n:]]
    names = [text.removeprefix("layer:") if kind == "push" else kind for kind, text in events if kind != "op"]
    assert names == ["outer", "outer.child", "pop", "pop"]
    assert [e[1] for e in rec.events[:n]].count("push") == 5  # outer and child twice, ident once
    ops = [text for kind, text in events if kind == "op" and text != "aten.detach.default"]
    pops = [i for i, (kind, _) in enumerate(events) if kind == "pop"]
    assert pops[1] == pops[0] + 1
    inside = [text for kind, text in events[:pops[0]] if kind == "op" and text != "aten.detach.default"]
    assert inside[-3:] == ["aten.mul.Tensor"] * 3  # the child's: a's and w's gradients, exp's
    assert ops[len(inside):] == ["aten.mul.Tensor", "aten.mul.Tensor", "aten.add.Tensor"]  # x*2's, x*3's, x's sum
    _intervals([e for e in rec.events[n:] if e[1] != "op"])


def test_canonical_layer_reads_both_frameworks_paths() -> None:
    cases = {
        "layers.3.attn.q_proj": "layers.3.attn", "layers/3/attn": "layers.3.attn", "layers.3/attn": "layers.3.attn",
        "layer:layers.12.ffn": "layers.12.ffn", "layers.0.ln1": "layers.0.ln1", "layers/7/ln2/mul": "layers.7.ln2",
        "jit(step)/transpose(jvp(TransformerLM))/layers/2/ffn/w1/dot_general": "layers.2.ffn",
        "token_embeddings": "token_embeddings", "jit(fwd)/lm_head/dot_general": "lm_head",
        "ln_final.weight": "ln_final", "loss": "loss", "layer:loss": "loss",
        "layers.3": None, "layers/3": None, "cross_entropy_loss": None, "my_layers.3.attn": None, "": None,
    }
    assert {path: canonical_layer(path) for path in cases} == cases
    assert [layer_kind(n) for n in ("layers.1.ln2", "ln_final", "layers.0.attn", "lm_head", OUTSIDE)] == \
        ["norm", "norm", "attn", "head", "outside"]


def _table() -> KernelTable:
    """Eight kernels with known durations, threads and launch times (ns)."""
    main, autograd = 1 << 24 | 1, 1 << 24 | 2
    rows = [  # (name, start, end, thread, launch)
        ("k_emb", 105, 115, main, 101), ("k_ffn", 120, 150, main, 118), ("k_add", 151, 155, main, 121),
        ("k_head", 160, 170, main, 156), ("k_ffn_bwd", 305, 365, autograd, 302),
        ("k_attn_bwd", 370, 390, autograd, 308), ("k_stray", 391, 396, autograd, 340),
        ("k_warm", 10, 20, main, 5),
    ]
    kt = KernelTable.from_kernels([Kernel(n, s, e) for n, s, e, _, _ in rows])
    order = np.argsort([s for _, s, _, _, _ in rows], kind="stable")
    kt.thread = np.array([rows[i][3] for i in order])
    kt.launch = np.array([rows[i][4] for i in order])
    return kt


MAIN, AUTOGRAD = 1 << 24 | 1, 1 << 24 | 2
LAYER_RANGES = [
    Range("layer:token_embeddings", 100, 110, MAIN), Range("layer:layers.0", 111, 140, MAIN),
    Range("layer:layers.0.ffn", 112, 119, MAIN), Range("layer:lm_head", 150, 158, MAIN),
    Range("layer:layers.0", 300, 330, AUTOGRAD), Range("layer:layers.0.ffn", 301, 304, AUTOGRAD),
    Range("layer:layers.0.attn", 305, 310, AUTOGRAD),
    Range("layer:layers.0.attn", 335, 345, MAIN),  # another thread's range: not the stray's
]


def test_labels_by_launch_on_the_launching_thread_and_totals_by_hand() -> None:
    kt = _table()
    labels = layer_labels(kt, LAYER_RANGES)
    got = {kt.name_of(i): labels[i] for i in range(len(kt))}
    assert got == {"k_emb": "token_embeddings", "k_ffn": "layers.0.ffn", "k_add": OUTSIDE, "k_head": "lm_head",
                   "k_ffn_bwd": "layers.0.ffn", "k_attn_bwd": "layers.0.attn", "k_stray": OUTSIDE,
                   "k_warm": OUTSIDE}
    # Two steps' worth of phases: forward [100, 180] and [400, 401] (empty), backward [300, 400].
    phases = {"forward": [Range("forward", 100, 180), Range("forward", 400, 401)],
              "backward": [Range("backward", 300, 400)]}
    totals = layer_totals(kt, phases, labels)
    # Hand count: forward kernels 10 + 30 + 4 + 10 over 2 steps; backward 60 + 20 + 5 in one.
    assert totals == {"forward": {"layers.0.ffn": 15.0, "token_embeddings": 5.0, "lm_head": 5.0, OUTSIDE: 2.0},
                      "backward": {"layers.0.ffn": 60.0, "layers.0.attn": 20.0, OUTSIDE: 5.0}}
    assert sum(totals["forward"].values()) == (10 + 30 + 4 + 10) / 2
    with pytest.raises(ValueError, match="one label per kernel"):
        layer_totals(kt, phases, labels[:3])


def _run(label: str, layers: dict) -> Run:
    return Run(label, label, None, None, layers={p: {k: ms * 1e6 for k, ms in v.items()} for p, v in layers.items()})


def test_diff_tables_layers_and_kinds_and_names_the_largest_moves() -> None:
    a = _run("A", {"forward": {"token_embeddings": 1, "layers.0.attn": 4, "layers.0.ffn": 5, "layers.1.ffn": 5,
                               "ln_final": 1, "lm_head": 3, OUTSIDE: 1},
                   "backward": {"layers.0.ffn": 10, "layers.1.ffn": 10, "layers.0.attn": 8}})
    b = _run("B", {"forward": {"token_embeddings": 1, "layers.0.attn": 3, "layers.0.ffn": 5, "layers.1.ffn": 17,
                               "ln_final": 1.5, "lm_head": 3, "loss": 0.5},
                   "backward": {"layers.0.ffn": 10, "layers.1.ffn": 34, "layers.0.attn": 6}})
    d = diff_runs(a, b)
    fwd = d.layers[0]
    assert [r.name for r in fwd.layers] == ["token_embeddings", "layers.0.attn", "layers.0.ffn", "layers.1.ffn",
                                            "ln_final", "lm_head", "loss", OUTSIDE]
    kinds = {k.name: (k.a_ms, k.b_ms, k.delta_ms) for k in fwd.kinds}
    assert kinds == {"embedding": (1, 1, 0), "attention": (4, 3, -1), "FFN": (10, 22, 12), "norms": (1, 1.5, 0.5),
                     "head": (3, 3, 0), "loss": (0, 0.5, 0.5), "outside layers": (1, 0, -1)}
    moves = largest_moves(d.layers)
    assert [(p, r.name, r.delta_ms) for p, r in moves] == [("backward", "layers.1.ffn", 24),
                                                           ("forward", "layers.1.ffn", 12),
                                                           ("backward", "layers.0.attn", -2)]
    text = diff_markdown(d)
    assert "Layers that moved most: backward layers.1.ffn +24.000 ms (10.000 -> 34.000)" in text
    assert "FFN: +36.000 ms" in text and "## backward by layer" in text
    doc = to_json(d)
    assert doc["layers"][1]["kinds"][1] == {"name": "FFN", "a_ms": 20.0, "b_ms": 44.0, "delta_ms": 24.0}
    assert diff_runs(a, _run("C", {})).layers == []


def test_planted_wide_block_widens_one_ffn_in_both_frameworks() -> None:
    """--wide-layer 1 --wide-factor 16 widens block 1's FFN only, the same in both model
    files, and the parameter count follows; the GPU fixtures (tests/data/layers/) check
    that the attribution finds it."""
    config = wide_block(get_config("tiny"), wide_layer=1, wide_factor=16)
    model = torch_impl.TransformerLM(config)
    assert model.layers[1].ffn.w1.weight.shape == (512 * 16, 128) and model.layers[0].ffn.w1.weight.shape == (512, 128)
    assert sum(p.numel() for p in model.parameters()) == config.num_params
    from flax import nnx

    import jax_impl

    jmodel = jax_impl.TransformerLM(config, rngs=nnx.Rngs(0))
    assert jmodel.layers[1].ffn.w1.weight.value.shape == (512 * 16, 128)
    assert jmodel.layers[0].ffn.w1.weight.value.shape == (512, 128)


def test_wide_block_converts_to_jax_and_bad_knobs_are_refused(capsys) -> None:
    from flax import nnx

    import jax_impl
    from harness.backends.jax.convert import jax_param_dict, torch_to_jax

    config = wide_block(get_config("tiny"), wide_layer=0, wide_factor=3)
    jax_model = jax_impl.TransformerLM(config, rngs=nnx.Rngs(0))
    torch_to_jax(torch_impl.TransformerLM(config), jax_model)
    assert jax_param_dict(jax_model)["layers.0.ffn.w2.weight"].shape == (128, 1536)
    with pytest.raises(ValueError, match="wide_layer=2 must be a block index"):
        wide_block(get_config("tiny"), wide_layer=2)
    assert run_cli.main(["--backend", "torch", "--model", "tiny", "--ctx", "64", "--device", "cpu",
                         "--wide-layer", "5"]) == 2
    assert run_cli.main(["--backend", "torch-compile", "--model", "tiny", "--ctx", "64", "--device", "cpu",
                         "--layer-ranges"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--wide-layer" in err[0] and "must be a block index" in err[0]
    assert "--layer-ranges with --backend torch-compile" in err[1] and "use --backend torch" in err[1]
