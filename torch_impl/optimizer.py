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

Two implementations of the same math, like torch.optim's ``foreach`` flag:
- ``foreach=True`` (default): each param group's tensors, grouped by device and dtype,
  are updated by ``torch._foreach_*`` ops, a few multi-tensor kernels per step instead
  of about ten kernels per parameter.
- ``foreach=False``: a Python loop over parameters, the reference.
``compile=True`` runs the foreach math under ``torch.compile`` (Inductor fuses it into a
few kernels). Both keep the same state per parameter (``t``, ``m``, ``v``; ``t`` counts
that parameter's own updates), so a run can switch between them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch


def _adamw_foreach_(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    ms: list[torch.Tensor],
    vs: list[torch.Tensor],
    step_sizes: list[float] | torch.Tensor,
    b1: float,
    b2: float,
    eps: float,
    decay: float,
) -> None:
    """One AdamW update of same-device, same-dtype tensors in place; step_sizes holds -a_t
    per tensor, as floats (one addcdiv with a scalar list) or as a 1-D tensor (under
    torch.compile, where float lists are baked into the graph and every new t recompiles)."""
    torch._foreach_mul_(ms, b1)
    torch._foreach_add_(ms, grads, alpha=1 - b1)
    torch._foreach_mul_(vs, b2)
    torch._foreach_addcmul_(vs, grads, grads, value=1 - b2)
    denom = torch._foreach_sqrt(vs)
    torch._foreach_add_(denom, eps)
    if isinstance(step_sizes, torch.Tensor):
        # (a m) / denom: the order the loop's addcdiv_ computes value * t1 / t2 in
        torch._foreach_addcdiv_(params, torch._foreach_mul(ms, step_sizes.unbind(0)), denom)
    else:
        torch._foreach_addcdiv_(params, ms, denom, step_sizes)
    torch._foreach_mul_(params, decay)


class AdamW(torch.optim.Optimizer):
    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        *,
        foreach: bool = True,
        compile: bool = False,
    ):
        if lr < 0:
            raise ValueError(f"lr={lr} must be >= 0")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas={betas} must each be in [0, 1)")
        if eps < 0 or weight_decay < 0:
            raise ValueError(f"eps={eps} and weight_decay={weight_decay} must be >= 0")
        if compile and not foreach:
            raise ValueError("compile=True compiles the foreach update; use it with foreach=True")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.foreach = foreach
        self.compiled = compile
        self._update: Callable[..., None] = torch.compile(_adamw_foreach_) if compile else _adamw_foreach_

    def _state(self, p: torch.Tensor) -> dict:
        """p's state, created at its first update; raises on a sparse gradient."""
        if p.grad.is_sparse:
            raise ValueError("AdamW does not support sparse gradients; use dense ones "
                             "(e.g. sparse=False in nn.Embedding)")
        state = self.state[p]
        if not state:
            state["t"] = 0
            state["m"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["v"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["t"] += 1
        return state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if self.foreach:
                self._step_foreach(group)
            else:
                self._step_loop(group)
        return loss

    def _step_loop(self, group: dict) -> None:
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self._state(p)
            t, m, v, g = state["t"], state["m"], state["v"], p.grad
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            a_t = lr * math.sqrt(1 - b2**t) / (1 - b1**t)
            p.addcdiv_(m, v.sqrt().add_(eps), value=-a_t)
            p.mul_(1 - lr * wd)

    def _step_foreach(self, group: dict) -> None:
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        # foreach kernels take tensors of one device and dtype, as torch.optim groups them
        lists: dict[tuple[torch.device, torch.dtype], tuple[list, list, list, list, list]] = {}
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self._state(p)
            t = state["t"]
            ps, gs, ms, vs, sizes = lists.setdefault((p.device, p.dtype), ([], [], [], [], []))
            ps.append(p)
            gs.append(p.grad)
            ms.append(state["m"])
            vs.append(state["v"])
            sizes.append(-lr * math.sqrt(1 - b2**t) / (1 - b1**t))
        for (device, _), (ps, gs, ms, vs, sizes) in lists.items():
            if self.compiled:
                sizes = torch.tensor(sizes, dtype=torch.float32, device=device)
            self._update(ps, gs, ms, vs, sizes, b1, b2, eps, 1 - lr * wd)
