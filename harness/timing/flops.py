"""Analytic FLOP counts of the Transformer LM, per training phase.

A matmul of (m x k) by (k x n) costs 2 m k n FLOPs. Per layer, with B batch, T tokens,
d = d_model, f = d_ff:
    projections  q, k, v, out: 4 * 2 B T d d
    SwiGLU       w1, w3, w2:   3 * 2 B T d f
    attention    QK^T and PV:  2 * 2 B T T d   (full T x T: what the naive path computes;
                                                a causal flash kernel skips about half)
plus the head 2 B T d V. Backward = 2 x forward (each product needs dX and dW).
Elementwise work (norms, softmax, RoPE, SwiGLU gate, loss) is left out, as usual for MFU.
The optimizer does no matmuls; its cost is memory traffic: AdamW reads p, g, m, v and
writes p, m, v, 7 float32 values per parameter.
"""

from __future__ import annotations

from harness.config import ModelConfig

FORMULA = (
    "forward = 2*B*T*(L*(4*d^2 + 3*d*f) + d*V) + L*4*B*T^2*d; backward = 2*forward; "
    "optimizer = 0 (memory-bound: 28 bytes/param)"
)


def forward_flops(config: ModelConfig, batch: int, ctx: int) -> int:
    d, f, L, V = config.d_model, config.d_ff, config.num_layers, config.vocab_size
    dense = 2 * batch * ctx * (L * (4 * d * d + 3 * d * f) + d * V)
    attention = L * 2 * (2 * batch * ctx * ctx * d)
    return dense + attention


def phase_flops(config: ModelConfig, batch: int, ctx: int) -> dict[str, int]:
    """FLOPs of each phase; `step` and `fused_step` are a whole training step."""
    fwd = forward_flops(config, batch, ctx)
    return {
        "forward": fwd,
        "backward": 2 * fwd,
        "optimizer": 0,
        "step": 3 * fwd,
        "fused_step": 3 * fwd,
    }


def optimizer_bytes(config: ModelConfig) -> int:
    """Device-memory traffic of one float32 AdamW update."""
    return 28 * config.num_params
