"""The fused step on one device takes the parameters and AdamW's moments as one array each
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


def test_the_layout_round_trips_the_parameters_and_adamw_state_exactly() -> None:
    from harness.backends.jax.flat import FlatLayout

    s = _session()
    params, opt = s.state, s.opt_state
    layout = FlatLayout.of(params)
    flat = layout.ravel(params)
    leaves = jax.tree.leaves(params)
    assert flat.shape == (sum(a.size for a in leaves),) == (layout.size,)
    np.testing.assert_array_equal(flat[:leaves[0].size], np.ravel(leaves[0]))
    for a, b in zip(leaves, jax.tree.leaves(layout.unravel(flat)), strict=True):
        np.testing.assert_array_equal(a, b)
    # AdamW's moments become one array each; its step count stays the scalar it is.
    flat_opt = layout.ravel_all(opt)
    assert [tuple(a.shape) for a in jax.tree.leaves(flat_opt)] == [(), (layout.size,), (layout.size,)]
    back = layout.unravel_all(flat_opt)
    assert jax.tree.structure(back) == jax.tree.structure(opt)
    for a, b in zip(jax.tree.leaves(opt), jax.tree.leaves(back), strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_layout_refuses_what_one_array_cannot_hold() -> None:
    from harness.backends.jax.flat import FlatLayout

    with pytest.raises(ValueError, match=r"one array needs one dtype; the parameters have \['bfloat16', 'float32'\]"):
        FlatLayout.of({"a": jnp.zeros(2), "b": jnp.zeros(2, jnp.bfloat16)})
    with pytest.raises(ValueError, match="not laid out like the parameters"):
        FlatLayout.of({"a": jnp.zeros(2)}).ravel({"b": jnp.zeros(2)})


def test_fused_steps_on_one_array_match_the_split_steps() -> None:
    """Fused, split and fused again against three split steps: the same losses and parameters
    to float32 rounding (both are the same arithmetic in different programs), with the state
    moved between the layouts in between."""
    flat, split = _session(), _session()
    losses = [float(flat.fused_step())]
    # The fused step holds the step count and the two moments beside the parameters: four arrays.
    assert len(jax.tree.leaves(flat._flat)) == 4 and flat._state is None
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
