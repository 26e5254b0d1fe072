"""Analytic device-memory model of one training step of `torch_impl.TransformerLM`.

Every term is derived from the model code (`torch_impl/model.py`) and what autograd
saves for each op there; B batch, T tokens, d = d_model, f = d_ff, H heads, V vocab,
L layers, P parameters. Byte sizes: fp32 4, bf16 2, token ids int64 8, the mask bool 1.

State (float32 whatever the dtype; AdamW state exists from the first update on):
    parameters P*4, gradients P*4, AdamW m and v 2*P*4; the token batch B*(T+1)*8.

Saved for backward, per layer, fp32 and tf32 (4 bytes each):
    RMSNorm x2:        input (the residual stream x, then h), x*rms [B,T,d] each, rms [B,T,1]
    q/k/v input:       the norm's output (one tensor, three linears)             [B,T,d]
    QK^T:              q and k after RoPE                                         2 x [B,T,d]
                       (RoPE itself saves only cos/sin: x*cos keeps cos, not x)
    softmax:           its output, the probabilities; the mask (bool)             [B,H,T,T]
                       (the scaled scores are *not* saved: scale and mask keep no input)
    PV:                probabilities (same tensor) and v                          [B,T,d]
    output proj:       the re-laid-out attention output                           [B,T,d]
    SwiGLU:            w1/w3 input (ln2 output), w1 out (silu input), silu out,
                       w3 out, gate product (w2 input)                            [B,T,d] + 4 x [B,T,f]
    = 10*B*T*d + 4*B*T*f + B*H*T*T elements, 2*B*T rms values, T*T mask bytes, cos/sin.

bf16 (torch.autocast): the residual stream, norm internals and softmax stay float32;
each linear's input is cast to bf16 *per call* (autocast caches casts of leaf weights
only), so q/k/v save three bf16 copies of ln1's output and w1/w3 two of ln2's; matmul
outputs are bf16 (half the bytes); the softmax saves float32 probabilities and PV saves
their bf16 copy (6 bytes per score, not 4); every linear saves its bf16 weight copy
(2 bytes per matmul parameter).

Head: the final norm as above, lm_head's input, and the log-softmax output of the loss,
B*T*V float32 (logits are cast to float32 for the loss in every dtype); the token batch
(the embedding's indices) and the flattened targets of the loss, int64.

Attention "fused" (SDPA): no probabilities or mask; what SDPA itself saves (its output,
log-sum-exp) is not modelled, so predictions for fused cells are a lower bound.

Phase peaks (what `torch.cuda.max_memory_allocated` after a reset sees; predictions):
    forward   = state without gradients + saved + the logits' transient copies
    backward  = state + max(saved + gradient of the log-softmax and logits, all gradients)
    optimizer = parameters + gradients + m + v + one sqrt(v) temporary of the largest tensor
Not modelled: allocator fragmentation and rounding, cuBLAS workspaces, CUDA context,
and transient buffers inside a layer (e.g. the unmasked scores next to the probabilities).
JAX/XLA plans its own buffers (fusion, rematerialisation); the model is the torch graph.
"""

from __future__ import annotations

from harness.config import ModelConfig

FP32, BF16, INT64 = 4, 2, 8


def matmul_params(config: ModelConfig) -> int:
    """Parameters of the linear layers (those autocast copies to bf16): blocks + lm_head."""
    d, f = config.d_model, config.d_ff
    return config.num_layers * (4 * d * d + 3 * d * f) + config.vocab_size * d


def state_terms(config: ModelConfig) -> dict[str, int]:
    """Bytes of parameters, gradients and AdamW moments (all float32)."""
    p = config.num_params * FP32
    return {"parameters": p, "gradients": p, "adamw_m": p, "adamw_v": p}


def activation_terms(config: ModelConfig, batch: int, ctx: int, dtype: str = "fp32") -> dict[str, int]:
    """Bytes saved for backward by one forward pass, by kind (sums over layers)."""
    if dtype not in ("fp32", "tf32", "bf16"):
        raise ValueError(f"unknown dtype {dtype!r}; choose one of fp32, tf32, bf16")
    B, T, d, f, H, L, V = (batch, ctx, config.d_model, config.d_ff, config.num_heads, config.num_layers,
                           config.vocab_size)
    btd, btf, scores = B * T * d, B * T * f, B * H * T * T
    bf16 = dtype == "bf16"
    mm = BF16 if bf16 else FP32  # bytes of a matmul output / matmul input
    naive = config.attention == "naive"
    terms = {
        # RMSNorm input and x*rms (float32 in every dtype), two norms per layer + final.
        "residual_stream_and_norms": (2 * L + 1) * (2 * btd * FP32 + B * T * FP32),
        # Inputs of q/k/v, w1/w3 and lm_head: one float32 tensor, or one bf16 copy per linear.
        "linear_inputs": L * ((3 + 2) * btd * BF16 if bf16 else 2 * btd * FP32) + btd * mm,
        "qkv_after_rope": L * 3 * btd * mm,  # q, k after RoPE; v
        "attention_output": L * btd * mm,
        "swiglu": L * 4 * btf * mm,  # w1 out, silu out, w3 out, gate product
        "attention_probs": L * scores * ((FP32 + BF16) if bf16 else FP32) if naive else 0,
        "mask_and_rope_tables": L * ((T * T if naive else 0) + 2 * T * (d // H) * FP32),
        "bf16_weight_copies": matmul_params(config) * BF16 if bf16 else 0,
        "log_softmax": B * T * V * FP32,
        "tokens": B * (T + 1) * INT64,
        # flatten() of the targets view copies them; nll_loss keeps them and a total weight
        "loss_targets": B * T * INT64 + FP32,
    }
    return terms


def saved_bytes(config: ModelConfig, batch: int, ctx: int, dtype: str = "fp32") -> int:
    """Total bytes autograd keeps for backward after one forward pass."""
    return sum(activation_terms(config, batch, ctx, dtype).values())


def _logits_transient(config: ModelConfig, batch: int, ctx: int, dtype: str) -> int:
    """Logits (the matmul's dtype) and their float32 copy, beside the saved log-softmax."""
    n = batch * ctx * config.vocab_size
    return n * (BF16 + FP32) if dtype == "bf16" else n * FP32


def predict(config: ModelConfig, batch: int, ctx: int, dtype: str = "fp32") -> dict:
    """Predicted peak bytes per phase with the terms behind them (see module docstring)."""
    state = state_terms(config)
    acts = activation_terms(config, batch, ctx, dtype)
    saved = sum(acts.values())
    p = state["parameters"]
    resident = p + state["adamw_m"] + state["adamw_v"]
    logits = _logits_transient(config, batch, ctx, dtype)
    largest = max(config.vocab_size * config.d_model, config.d_model * config.d_ff) * FP32
    peaks = {
        "forward": resident + saved + logits,
        "backward": resident + max(saved + 2 * batch * ctx * config.vocab_size * FP32, state["gradients"]),
        "optimizer": resident + state["gradients"] + largest,
    }
    peaks["step"] = max(peaks.values())
    return {"state": state, "activations": acts, "saved_bytes": saved, "peaks": peaks}
