"""The analytic FLOP formula against torch's own count of every matmul the model runs."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import torch_impl
from harness.config import get_config
from harness.timing.flops import forward_flops, phase_flops


@pytest.mark.parametrize("name, batch, ctx", [("tiny", 2, 32), ("mini", 1, 48)])
def test_formula_matches_counted_matmuls(name, batch, ctx):
    cfg = get_config(name)
    model = torch_impl.TransformerLM(cfg)
    tokens = torch.randint(0, cfg.vocab_size, (batch, ctx))
    with FlopCounterMode(display=False) as fwd_counter:
        loss = torch_impl.cross_entropy_loss(model(tokens), tokens)
    with FlopCounterMode(display=False) as bwd_counter:
        loss.backward()
    assert fwd_counter.get_total_flops() == forward_flops(cfg, batch, ctx)
    assert bwd_counter.get_total_flops() == phase_flops(cfg, batch, ctx)["backward"]


def test_attention_term_grows_quadratically():
    cfg = get_config("small")
    linear = forward_flops(cfg, 1, 1024) - 2 * forward_flops(cfg, 1, 512)
    assert linear == 12 * 4 * 1024**2 * 768 - 2 * 12 * 4 * 512**2 * 768
