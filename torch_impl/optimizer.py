"""AdamW with decoupled weight decay (Loshchilov & Hutter), written out by hand.

Per parameter, with t starting at 1:
    m <- b1 m + (1 - b1) g
    v <- b2 v + (1 - b2) g^2
    a_t = lr sqrt(1 - b2^t) / (1 - b1^t)
    theta <- theta - a_t m / (sqrt(v) + eps)
    theta <- theta - lr * weight_decay * theta

How the libraries differ from this (all differences vanish as eps -> 0 and lr*wd -> 0,
and are far below float32 noise at the defaults; tests/test_optimizers.py measures them):
- torch.optim.AdamW adds eps to the bias-corrected sqrt(v_hat), i.e. its effective eps
  is ours times sqrt(1 - b2^t); and it decays theta *before* the Adam step, so the decay
  sees the old theta, here it sees the updated one.
- optax.adamw likewise adds eps to sqrt(v_hat) and decays the pre-step theta.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch


class AdamW(torch.optim.Optimizer):
    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
    ):
        if lr < 0:
            raise ValueError(f"lr={lr} must be >= 0")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas={betas} must each be in [0, 1)")
        if eps < 0 or weight_decay < 0:
            raise ValueError(f"eps={eps} and weight_decay={weight_decay} must be >= 0")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["t"] = 0
                    state["m"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["v"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["t"] += 1
                t, m, v, g = state["t"], state["m"], state["v"], p.grad
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                a_t = lr * math.sqrt(1 - b2**t) / (1 - b1**t)
                p.addcdiv_(m, v.sqrt().add_(eps), value=-a_t)
                p.mul_(1 - lr * wd)
        return loss
