"""The memory model against torch's own accounting on CPU.

Saved-for-backward bytes are counted independently with
`torch.autograd.graph.saved_tensors_hooks`: every tensor autograd packs during one
forward, deduplicated by storage (views share one), parameters left out (they are
state, not activations). Stated tolerance: 10% on the total, 2% on one layer's share.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.backends.torch.session import TorchSession
from harness.config import get_config
from harness.sweeps import step_memory as memory_model
from harness.timing.tokens import make_tokens

TOTAL_TOLERANCE = 0.10
LAYER_TOLERANCE = 0.02


def _session(config, batch: int, ctx: int, dtype: str) -> TorchSession:
    tokens = make_tokens(config.vocab_size, batch, ctx, seed=0)
    return TorchSession(config, tokens, device="cpu", dtype=dtype, seed=0)


def counted_saved_bytes(config, batch: int, ctx: int, dtype: str) -> int:
    """Bytes of the distinct non-parameter storages autograd saves in one forward."""
    s = _session(config, batch, ctx, dtype)
    params = {p.untyped_storage().data_ptr() for p in s.model.parameters()}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            storages[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        s.forward()
    return sum(storages.values())


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("model", ["tiny", "mini"])
def test_saved_bytes_match_autograd(model: str, dtype: str) -> None:
    config = get_config(model)
    counted = counted_saved_bytes(config, 2, 64, dtype)
    predicted = memory_model.saved_bytes(config, 2, 64, dtype)
    assert abs(predicted - counted) <= TOTAL_TOLERANCE * counted, (predicted, counted)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_one_layer_of_saved_bytes(dtype: str) -> None:
    """The head (log-softmax of B*T*V) dominates small models; one layer's share is checked
    alone, at a context where the attention probabilities weigh, by adding a layer."""
    base = get_config("tiny")
    deeper = dataclasses.replace(base, num_layers=base.num_layers + 1)
    counted = counted_saved_bytes(deeper, 2, 128, dtype) - counted_saved_bytes(base, 2, 128, dtype)
    predicted = memory_model.saved_bytes(deeper, 2, 128, dtype) - memory_model.saved_bytes(base, 2, 128, dtype)
    assert abs(predicted - counted) <= LAYER_TOLERANCE * counted, (predicted, counted)


def test_state_bytes_are_exact() -> None:
    config = get_config("tiny")
    s = _session(config, 2, 16, "fp32")
    s.forward()
    s.backward()
    grads = sum(p.grad.numel() * p.grad.element_size() for p in s.model.parameters())
    s.optimizer_step()
    state = memory_model.state_terms(config)
    assert state["parameters"] == sum(p.numel() * p.element_size() for p in s.model.parameters())
    assert state["gradients"] == grads
    moments = [st[k] for st in s.optimizer.state.values() for k in ("m", "v")]
    assert state["adamw_m"] + state["adamw_v"] == sum(t.numel() * t.element_size() for t in moments)


def test_peaks_grow_with_context_and_step_is_the_largest() -> None:
    config = get_config("small")
    short, long = (memory_model.predict(config, 4, ctx, "fp32")["peaks"] for ctx in (128, 1024))
    assert long["forward"] > short["forward"] and long["backward"] > short["backward"]
    assert long["optimizer"] == short["optimizer"]  # no activations in the update
    assert long["step"] == max(long["forward"], long["backward"], long["optimizer"])
    # naive attention's probabilities grow with T^2: 8x the context, > 8x their bytes
    acts = [memory_model.activation_terms(config, 4, ctx, "fp32")["attention_probs"] for ctx in (128, 1024)]
    assert acts[1] == 64 * acts[0]


def test_bf16_halves_matmul_activations_but_not_the_residual_stream() -> None:
    config = get_config("small")
    fp32, bf16 = (memory_model.activation_terms(config, 4, 256, dt) for dt in ("fp32", "bf16"))
    assert bf16["swiglu"] * 2 == fp32["swiglu"]
    assert bf16["residual_stream_and_norms"] == fp32["residual_stream_and_norms"]
    assert bf16["attention_probs"] == fp32["attention_probs"] * 3 // 2  # float32 + bf16 copy


def test_unknown_dtype_is_rejected() -> None:
    with pytest.raises(ValueError, match="fp32, tf32, bf16"):
        memory_model.activation_terms(get_config("tiny"), 1, 8, "fp16")
