"""The fused step on one device takes the parameters and AdamW's moments as a few arrays each
(`harness.backends.jax.flat`): the layout's round trip, and the steps against the split
step's programs, which keep the model's arrays."""

from __future__ import annotations

import numpy as np
import pytest

from harness.config import get_config
from harness.timing.tokens import make_tokens

jax = pytest.importorskip("jax")
jnp = jax.numpy


def _session():
    from harness.backends.jax.session import JaxSession

    config = get_config("tiny")
    return JaxSession(config, make_tokens(config.vocab_size, 2, 32, 0), device="cpu", dtype="fp32", seed=0)


def _split_step(s) -> float:
    loss = float(s.forward())
    s.backward()
    s.optimizer_step()
    return loss


@pytest.mark.parametrize("max_leaves", [64, 5])
def test_the_layout_round_trips_the_parameters_and_adamw_state_exactly(max_leaves) -> None:
    from harness.backends.jax.flat import FlatLayout

    s = _session()
    params, opt = s.state, s.opt_state
    layout = FlatLayout.of(params, max_leaves)
    flats = layout.ravel(params)
    leaves = jax.tree.leaves(params)
    # Consecutive parameters, at most max_leaves to an array, every one of them once.
    groups = -(-len(leaves) // max_leaves)
    assert len(flats) == len(layout.groups) == groups and (groups > 1) == (max_leaves == 5)
    assert [f.shape for f in flats] == [(sum(x.size for x in leaves[a:b]),) for a, b in layout.groups]
    assert sum(f.size for f in flats) == layout.size == sum(x.size for x in leaves)
    a, b = layout.groups[-1]
    np.testing.assert_array_equal(flats[-1][:leaves[a].size], np.ravel(leaves[a]))
    np.testing.assert_array_equal(flats[-1][-leaves[b - 1].size:], np.ravel(leaves[b - 1]))
    for x, y in zip(leaves, jax.tree.leaves(layout.unravel(flats)), strict=True):
        np.testing.assert_array_equal(x, y)
    # AdamW's moments become the same arrays; its step count stays the scalar it is.
    flat_opt = layout.ravel_all(opt)
    assert [tuple(x.shape) for x in jax.tree.leaves(flat_opt)] == [()] + 2 * [f.shape for f in flats]
    back = layout.unravel_all(flat_opt)
    assert jax.tree.structure(back) == jax.tree.structure(opt)
    for x, y in zip(jax.tree.leaves(opt), jax.tree.leaves(back), strict=True):
        np.testing.assert_array_equal(x, y)


def test_the_layout_cut_by_kinds_holds_one_kind_to_an_array() -> None:
    """With each parameter's dtype in the backward as its kind (bf16 matmul weights beside
    float32 norms and the embedding), an array ends where the kind changes and at max_leaves:
    `tiny`'s two layers of seven weights and two norms each, then the head, then the final norm
    with the embedding."""
    from harness.backends.jax.flat import FlatLayout
    from harness.backends.jax.precision import sum_dtypes

    s = _session()
    layout = FlatLayout.of(s.state, kinds=sum_dtypes(s.state, "bf16"))
    assert layout.groups == ((0, 7), (7, 9), (9, 16), (16, 18), (18, 19), (19, 21))
    assert layout.kinds == ("bfloat16", "float32") * 3
    assert FlatLayout.of(s.state, 5, kinds=sum_dtypes(s.state, "bf16")).groups[:3] == ((0, 5), (5, 7), (7, 9))
    assert FlatLayout.of(s.state, kinds=sum_dtypes(s.state, "fp32")).groups == ((0, 21),)


def test_the_layout_refuses_what_one_array_cannot_hold() -> None:
    from harness.backends.jax.flat import FlatLayout

    with pytest.raises(ValueError, match=r"one array needs one dtype; the parameters have \['bfloat16', 'float32'\]"):
        FlatLayout.of({"a": jnp.zeros(2), "b": jnp.zeros(2, jnp.bfloat16)})
    with pytest.raises(ValueError, match="not laid out like the parameters"):
        FlatLayout.of({"a": jnp.zeros(2)}).ravel({"b": jnp.zeros(2)})


@pytest.mark.parametrize("max_leaves", [64, 5])
def test_fused_steps_on_the_flat_layout_match_the_split_steps(max_leaves, monkeypatch) -> None:
    """Fused, split and fused again against three split steps: the same losses and parameters
    to float32 rounding (both are the same arithmetic in different programs), with the state
    moved between the layouts in between; in one array each, and in several."""
    from harness.backends.jax import flat as flat_module

    monkeypatch.setattr(flat_module, "MAX_LEAVES", max_leaves)
    flat, split = _session(), _session()
    losses = [float(flat.fused_step())]
    # The fused step holds the step count, and the parameters and two moments in `groups` arrays each.
    groups = len(flat._layout.groups)
    assert groups == (1 if max_leaves == 64 else 5)
    assert len(jax.tree.leaves(flat._flat)) == 1 + 3 * groups and flat._state is None
    losses.append(_split_step(flat))
    assert flat._flat is None
    losses.append(float(flat.fused_step()))
    reference = [_split_step(split) for _ in range(3)]
    np.testing.assert_allclose(losses, reference, rtol=1e-6)
    got, want = flat.params(), split.params()
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-7, err_msg=name)
    assert int(flat.opt_state.count) == int(split.opt_state.count) == 3


REPLICATED_SCRIPT = """
import dataclasses, json
import jax, numpy as np
from harness.config import get_config
from harness.timing.runner import make_session
from harness.timing.spec import RunSpec

def split(s):
    loss = float(s.forward()); s.backward(); s.optimizer_step()
    return loss

opts = RunSpec(backend="jax", model="tiny", ctx=16, batch=2, data_parallel=2, parallel="ddp")
two = make_session(opts, get_config("tiny"))
one = make_session(dataclasses.replace(opts, batch=4, data_parallel=1), get_config("tiny"))
layouts = [x.sharding for x in jax.tree.leaves((two.state, two.opt_state))]
losses = [float(two.fused_step())]
flat = jax.tree.leaves(two._flat)
replicated = all(x.sharding.is_fully_replicated and len(x.sharding.device_set) == 2 for x in flat)
losses += [split(two), float(two.fused_step()), split(two)]
reference = [split(one) for _ in range(4)]
got, want = two.params(), one.params()
print(json.dumps({"losses": losses, "reference": reference, "replicated": replicated, "arrays": len(flat),
                  "max_abs": max(float(np.max(np.abs(got[k] - want[k]))) for k in want),
                  "layouts_kept": layouts == [x.sharding for x in jax.tree.leaves((two.state, two.opt_state))],
                  "compiles": [two._update._cache_size(), two._fused_flat._cache_size()]}))
"""


def test_replicated_parameters_take_the_flat_layout_over_two_devices() -> None:
    """With the parameters replicated over two host devices (`--parallel ddp`), the fused step
    takes the flat arrays, replicated on both; fused and split steps in turn match one device's
    split steps on the global batch (the two devices' gradients summed in another order: float32
    rounding), each program compiles once, and the split step gets back the layouts it began with."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p))
    proc = subprocess.run([sys.executable, "-c", REPLICATED_SCRIPT], cwd=root, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(proc.stdout.splitlines()[-1])
    assert r["replicated"] and r["arrays"] == 4  # tiny's 21 parameters in one array, two moments, the count
    np.testing.assert_allclose(r["losses"], r["reference"], rtol=1e-6)
    assert r["max_abs"] < 1e-5
    assert r["layouts_kept"] and r["compiles"] == [1, 1]
