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
