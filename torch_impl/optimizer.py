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

Three implementations of the same math, like torch.optim's ``foreach`` and ``fused`` flags.
At this model's sizes the update is bound by memory bandwidth, so what counts is how many
passes over parameter-sized tensors each makes (bytes per float32 parameter in brackets;
the least an update can move is 28: read theta, g, m, v, write theta, m, v):
- ``foreach=False``: a Python loop over parameters, the reference; per parameter eight
  kernels, each a pass (80 B): m *= b1, m += (1-b1) g, v *= b2, v += (1-b2) g^2,
  s = sqrt(v), s += eps, theta += -a_t m / s, theta *= 1 - lr*wd.
- ``foreach=True`` (default): each param group's tensors, grouped by device and dtype,
  are updated by ``torch._foreach_*`` ops, a few multi-tensor kernels per step, and 7
  passes (72 B): m's two passes are one ``lerp`` (m + (1-b1)(g - m), the same value in
  real arithmetic); the decay pass is skipped where weight_decay or lr is 0. The rest has
  no foreach op that does two of its steps at once.
- ``fused=True``: ``torch._fused_adamw_``, the multi-tensor kernel behind
  ``torch.optim.AdamW(fused=True)``: one pass (28 B), with hyperparameters rewritten per
  call so that it computes this module's algorithm, not torch's (below).
``compile=True`` runs the foreach math under ``torch.compile`` (Inductor fuses it into a
few kernels). All keep the same state per parameter (``t``, ``m``, ``v``; ``t`` counts
that parameter's own updates), so a run can switch between them.

The fused kernel's rewrite. With c1 = 1 - b1^t, c2 = 1 - b2^t, torch's kernel given
(lr', wd', eps') computes
    theta' = (1 - lr' wd') theta - (lr' / c1) m / (sqrt(v) / sqrt(c2) + eps')
           = (1 - lr' wd') theta - (lr' sqrt(c2) / c1) m / (sqrt(v) + eps' sqrt(c2)).
With d = 1 - lr wd, take lr' = lr d, wd' = wd / d, eps' = eps / sqrt(c2): then
lr' wd' = lr wd, so 1 - lr' wd' = d; lr' sqrt(c2) / c1 = d a_t; eps' sqrt(c2) = eps; and
    theta' = d theta - d a_t m / (sqrt(v) + eps) = d (theta - a_t m / (sqrt(v) + eps)),
our update with the decay after the step. eps' depends on t, so the kernel runs once per
(device, dtype, t). d = 0 has no wd' and d < 0 needs lr' < 0, which torch.optim never
passes the kernel; a group with lr*wd >= 1 takes the foreach update instead.
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
    torch._foreach_lerp_(ms, grads, 1 - b1)
    torch._foreach_mul_(vs, b2)
    torch._foreach_addcmul_(vs, grads, grads, value=1 - b2)
    denom = torch._foreach_sqrt(vs)
    torch._foreach_add_(denom, eps)
    if isinstance(step_sizes, torch.Tensor):
        # (a m) / denom: the order the loop's addcdiv_ computes value * t1 / t2 in
        torch._foreach_addcdiv_(params, torch._foreach_mul(ms, step_sizes.unbind(0)), denom)
    else:
        torch._foreach_addcdiv_(params, ms, denom, step_sizes)
    if decay != 1:
        torch._foreach_mul_(params, decay)


def _adamw_fused_(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    ms: list[torch.Tensor],
    vs: list[torch.Tensor],
    t: int,
    lr: float,
    b1: float,
    b2: float,
    eps: float,
    weight_decay: float,
) -> None:
    """One AdamW update of same-device, same-dtype tensors that share t, by torch's fused
    kernel with the hyperparameters rewritten (module docstring); needs lr*weight_decay < 1."""
    d = 1 - lr * weight_decay
    # the kernel reads t per tensor from float32 tensors on the params' device, as torch.optim
    # keeps it (already incremented); the tensors share t, so one tensor serves them all
    step = torch.full((), float(t), dtype=torch.float32, device=params[0].device)
    torch._fused_adamw_(params, grads, ms, vs, [], [step] * len(params), lr=lr * d, beta1=b1, beta2=b2,
                        weight_decay=weight_decay / d, eps=eps / math.sqrt(1 - b2**t), amsgrad=False,
                        maximize=False, grad_scale=None, found_inf=None)


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
        fused: bool = False,
    ):
        if lr < 0:
            raise ValueError(f"lr={lr} must be >= 0")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas={betas} must each be in [0, 1)")
        if eps < 0 or weight_decay < 0:
            raise ValueError(f"eps={eps} and weight_decay={weight_decay} must be >= 0")
        if compile and not foreach:
            raise ValueError("compile=True compiles the foreach update; use it with foreach=True")
        if fused and (compile or not foreach):
            raise ValueError("fused=True falls back to the uncompiled foreach update where lr*weight_decay >= 1; "
                             "use it with foreach=True, compile=False")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.foreach = foreach
        self.compiled = compile
        self.fused = fused
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
            if self.fused and group["lr"] * group["weight_decay"] < 1:
                self._step_fused(group)
            elif self.foreach:
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

    def _grouped(self, group: dict, by_t: bool) -> dict[tuple, tuple[list, list, list, list, list[int]]]:
        """The group's params with gradients (their state advanced one step) as lists of
        params, grads, m, v and t per (device, dtype), or per (device, dtype, t) with by_t:
        multi-tensor kernels take tensors of one device and dtype, as torch.optim groups them."""
        lists: dict[tuple, tuple[list, list, list, list, list[int]]] = {}
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self._state(p)
            key = (p.device, p.dtype, state["t"]) if by_t else (p.device, p.dtype)
            for xs, x in zip(lists.setdefault(key, ([], [], [], [], [])),
                             (p, p.grad, state["m"], state["v"], state["t"])):
                xs.append(x)
        return lists

    def _step_foreach(self, group: dict) -> None:
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        for (device, _), (ps, gs, ms, vs, ts) in self._grouped(group, by_t=False).items():
            sizes = [-lr * math.sqrt(1 - b2**t) / (1 - b1**t) for t in ts]
            if self.compiled:
                sizes = torch.tensor(sizes, dtype=torch.float32, device=device)
            self._update(ps, gs, ms, vs, sizes, b1, b2, eps, 1 - lr * wd)

    def _step_fused(self, group: dict) -> None:
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        for (_, _, t), (ps, gs, ms, vs, _) in self._grouped(group, by_t=True).items():
            _adamw_fused_(ps, gs, ms, vs, t, lr, b1, b2, eps, wd)
