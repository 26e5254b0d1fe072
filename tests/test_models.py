"""Each model against independent references: init, RoPE, RMSNorm, causality, fused path."""

import dataclasses
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

import jax_impl
import torch_impl
from harness.backends.jax.convert import jax_param_dict, jax_to_torch, torch_to_jax
from harness.config import get_config
from jax_impl import model as jm
from torch_impl import model as tm

CFG = get_config("tiny")


def rope_reference(x: np.ndarray, theta: float) -> np.ndarray:
    """RoPE via complex numbers: pair (2i, 2i+1) is z = x[2i] + i x[2i+1], rotated by e^{i p w_i}. x: (T, d)."""
    T, d = x.shape
    z = x[:, 0::2] + 1j * x[:, 1::2]
    w = theta ** (-np.arange(0, d, 2) / d)
    z = z * np.exp(1j * np.arange(T)[:, None] * w[None, :])
    out = np.empty_like(x)
    out[:, 0::2], out[:, 1::2] = z.real, z.imag
    return out


def test_rope_matches_complex_rotation_in_both():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 9, 1, 64)).astype(np.float32)  # (B, T, nh, hd)
    ref = rope_reference(x[0, :, 0].astype(np.float64), 10_000.0)
    cos, sin = tm.rope_angles(9, 64, 10_000.0, "cpu")
    got_t = tm.apply_rope(torch.from_numpy(x), cos, sin).numpy()[0, :, 0]
    cos, sin = jm.rope_tables(9, 64, 10_000.0)
    got_j = np.asarray(jm.apply_rope(jnp.asarray(x), cos, sin))[0, :, 0]
    # float32 angles t * theta^(-i/d) are off by ~2 eps of the angle (up to T rad), which
    # moves the rotated value by that much of |x|; cos, sin and the rotation add a few eps of |x|
    atol = (2 * 9 + 8) * float(np.finfo(np.float32).eps) * float(np.abs(x).max())
    np.testing.assert_allclose(got_t, ref, rtol=0, atol=atol)
    np.testing.assert_allclose(got_j, ref, rtol=0, atol=atol)
    assert np.abs(ref - x[0, :, 0]).max() > 0.5  # the rotation did something


def test_compiled_torch_reads_rope_from_tables_made_once_a_step():
    """Inductor's generated forward and backward evaluate no cos or sin per element: the
    tables come from one op call a step, shared by every layer, whose values equal the
    eager function's."""
    from torch._inductor.utils import run_and_get_code

    config = get_config("tiny")
    model = tm.TransformerLM(config)
    tokens = torch.randint(0, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    compiled = torch.compile(lambda t: tm.cross_entropy_loss(model(t), t))
    _, codes = run_and_get_code(lambda: compiled(tokens).backward())
    source = "\n".join(codes)
    assert len(codes) == 2  # the forward and the backward
    assert len(re.findall(r"= torch\.ops\.xfprof\.rope_angles\.default\(", source)) == 1
    assert re.findall(r"\b(?:cos|sin)\(", source) == []
    for got, want in zip(torch.ops.xfprof.rope_angles(16, config.d_head, config.rope_theta, torch.device("cpu")),
                         tm.rope_angles(16, config.d_head, config.rope_theta, "cpu")):
        assert torch.equal(got, want)


def test_rmsnorm_matches_formula_and_keeps_dtype():
    x = np.random.default_rng(1).standard_normal((3, 128)).astype(np.float32)
    ref = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5)
    # the float32 mean of 128 squares is off by at most 128 * eps/2 relative (summed in any
    # order), its square root by half that, and the scaling adds one rounding
    rtol = (128 / 4 + 2) * float(np.finfo(np.float32).eps)
    np.testing.assert_allclose(tm.RMSNorm(128, 1e-5)(torch.from_numpy(x)).detach().numpy(), ref, rtol=rtol)
    # JAX's norm takes the residual add with it: (x + delta, the sum normalized)
    half = x / 2
    h, y = jm.RMSNorm(128, 1e-5)(jnp.asarray(half), jnp.asarray(half))
    np.testing.assert_array_equal(np.asarray(h), x)
    np.testing.assert_allclose(np.asarray(y), ref, rtol=rtol)
    assert tm.RMSNorm(128, 1e-5)(torch.from_numpy(x).bfloat16()).dtype == torch.bfloat16
    assert jm.RMSNorm(128, 1e-5)(jnp.asarray(x, jnp.bfloat16))[1].dtype == jnp.bfloat16
    assert jm.RMSNorm(128, 1e-5)(jnp.asarray(x), out_dtype=jnp.bfloat16)[1].dtype == jnp.bfloat16


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_init_is_truncated_normal_with_the_stated_std(framework):
    cfg = get_config("mini")
    if framework == "torch":
        torch.manual_seed(0)
        params = {k: v.detach().numpy() for k, v in torch_impl.TransformerLM(cfg).state_dict().items()}
    else:
        params = {k: np.asarray(v) for k, v in jax_param_dict(jax_impl.TransformerLM(cfg, rngs=nnx.Rngs(0))).items()}
    w1 = params["layers.0.ffn.w1.weight"]
    std = math.sqrt(2 / (256 + 1024))
    # A normal cut at +-3 sigma has std 0.9866 sigma.
    assert w1.shape == (1024, 256) and abs(w1.std() / std - 0.9866) < 0.01 and np.abs(w1).max() <= 3 * std + 1e-7
    emb = params["token_embeddings.weight"]
    assert abs(emb.std() - 0.9866) < 0.01 and np.abs(emb).max() <= 3.0 + 1e-6
    assert np.all(params["layers.1.ln2.weight"] == 1) and np.all(params["ln_final.weight"] == 1)
    assert params["lm_head.weight"].shape == (10_000, 256)
    assert not any("bias" in k for k in params)


def test_parameter_names_and_shapes_match_across_frameworks():
    torch.manual_seed(0)
    t = torch_impl.TransformerLM(CFG)
    j = jax_param_dict(jax_impl.TransformerLM(CFG, rngs=nnx.Rngs(0)))
    assert {k: tuple(v.shape) for k, v in t.state_dict().items()} == {k: tuple(v.shape) for k, v in j.items()}


def test_conversion_round_trip_is_exact():
    torch.manual_seed(3)
    t1, t2 = torch_impl.TransformerLM(CFG), torch_impl.TransformerLM(CFG)
    j = jax_impl.TransformerLM(CFG, rngs=nnx.Rngs(0))
    torch_to_jax(t1, j)
    jax_to_torch(j, t2)
    for (k, a), b in zip(t1.state_dict().items(), t2.state_dict().values()):
        assert torch.equal(a, b), k


def test_conversion_into_a_model_of_shapes_alone_is_exact():
    """The JAX session builds its model under nnx.eval_shape when torch's weights are copied
    in (no initialisation of its own to throw away): every parameter comes out concrete and
    equal to torch's, in the dtype the model declares."""
    torch.manual_seed(4)
    t = torch_impl.TransformerLM(CFG)
    j = nnx.eval_shape(lambda: jax_impl.TransformerLM(CFG, rngs=nnx.Rngs(0)))
    torch_to_jax(t, j)
    got = jax_param_dict(j)
    assert got.keys() == t.state_dict().keys()
    for k, v in t.state_dict().items():
        assert isinstance(got[k], jax.Array) and got[k].dtype == jnp.float32, k
        np.testing.assert_array_equal(np.asarray(got[k]), v.numpy(), err_msg=k)


def test_converted_jax_parameters_do_not_alias_torch_memory():
    """On CPU JAX may wrap an aligned NumPy buffer without copying; torch's in-place
    optimizer must not be able to change the converted JAX model (this once made parity
    fail at random, through JAX's asynchronous dispatch)."""
    torch.manual_seed(0)
    t = torch_impl.TransformerLM(CFG)
    j = jax_impl.TransformerLM(CFG, rngs=nnx.Rngs(0))
    torch_to_jax(t, j)
    before = {k: np.asarray(v).copy() for k, v in jax_param_dict(j).items()}
    with torch.no_grad():
        for p in t.parameters():
            p.add_(1.0)
    after = jax_param_dict(j)
    assert all(np.array_equal(np.asarray(after[k]), v) for k, v in before.items())


def test_conversion_rejects_a_different_architecture():
    j = jax_impl.TransformerLM(get_config("mini"), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="parameter names differ"):
        torch_to_jax(torch_impl.TransformerLM(CFG), j)


def _logits(framework, cfg, tokens, seed=0):
    torch.manual_seed(seed)
    t = torch_impl.TransformerLM(cfg)
    if framework == "torch":
        return t(torch.from_numpy(tokens)).detach().numpy()
    j = jax_impl.TransformerLM(cfg, rngs=nnx.Rngs(0))
    torch_to_jax(t, j)
    return np.asarray(j(jnp.asarray(tokens)))


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_causal_future_tokens_do_not_change_the_past(framework):
    tokens = np.random.default_rng(0).integers(0, CFG.vocab_size, (1, 24))
    changed = tokens.copy()
    changed[0, 12:] = (changed[0, 12:] + 7) % CFG.vocab_size
    a, b = _logits(framework, CFG, tokens), _logits(framework, CFG, changed)
    np.testing.assert_allclose(a[:, :12], b[:, :12], atol=1e-5)
    assert np.abs(a[:, 12:] - b[:, 12:]).max() > 1e-2


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_fused_attention_matches_naive(framework):
    tokens = np.random.default_rng(1).integers(0, CFG.vocab_size, (2, 40))
    naive = _logits(framework, CFG, tokens)
    fused = _logits(framework, dataclasses.replace(CFG, attention="fused"), tokens)
    assert np.linalg.norm(fused - naive) / np.linalg.norm(naive) < 1e-5


def test_torch_rejects_pallas_attention():
    with pytest.raises(ValueError, match="JAX kernel"):
        torch_impl.TransformerLM(get_config("tiny", attention="pallas"))


def test_loss_is_mean_next_token_cross_entropy():
    logits = np.random.default_rng(2).standard_normal((2, 5, 11)).astype(np.float32)
    targets = np.random.default_rng(3).integers(0, 11, (2, 5))
    shifted = logits - logits.max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    ref = -np.take_along_axis(logp, targets[..., None], -1).mean()
    assert abs(float(torch_impl.cross_entropy_loss(torch.from_numpy(logits), torch.from_numpy(targets))) - ref) < 1e-5
    assert abs(float(jax_impl.cross_entropy_loss(jnp.asarray(logits), jnp.asarray(targets))) - ref) < 1e-5
    jax.clear_caches()


def test_pallas_attention_model_matches_naive():
    """The JAX model with the Pallas kernel (interpreted on CPU) against the naive path:
    logits, loss and every gradient, within the fp32 parity bounds."""
    from harness.backends.jax import TOLERANCES
    from harness.backends.jax.session import JaxSession
    from harness.backends.torch.session import init_model
    from harness.timing.parity import rel_err
    from harness.timing.tokens import make_tokens

    tokens = make_tokens(CFG.vocab_size, 1, 40, seed=5)  # 40: not a multiple of the kernel's block
    torch_model = init_model(CFG, 0)
    naive = JaxSession(CFG, tokens, device="cpu", dtype="fp32", seed=0, weights=torch_model)
    pallas = JaxSession(dataclasses.replace(CFG, attention="pallas"), tokens, device="cpu", dtype="fp32", seed=0,
                        weights=torch_model)
    tol = TOLERANCES["fp32"]
    assert rel_err(pallas.logits(), naive.logits()) < tol["logits"]
    loss_p, grads_p = pallas.loss_and_grads()
    loss_n, grads_n = naive.loss_and_grads()
    assert abs(loss_p - loss_n) / loss_n < tol["loss"]
    worst = max(grads_n, key=lambda k: rel_err(grads_p[k], grads_n[k]))
    assert rel_err(grads_p[worst], grads_n[worst]) < tol["grad"], worst
