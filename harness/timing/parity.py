"""Parity of the PyTorch and JAX models: same weights, same batch, same numbers?

Both models start from the same weights (torch_impl's seeded initialisation, copied
into the Flax model), see the same token batch, and are compared by the relative error
||jax - torch|| / ||torch|| of: logits, loss, every parameter's gradient, and after
`steps` AdamW steps every parameter and every parameter's total update (theta_N - theta_0).
The update check is the sharp one for the optimizer: parameters barely move in a few
steps, so a wrong optimizer hides in the parameters' relative error but not in the
update's. The library behind `python -m harness.parity`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from harness.common.results import environment
from harness.config import ModelConfig, backend_attention
from harness.timing.tokens import make_tokens

# Relative-error bounds per dtype. float32 reorderings give ~1e-6 on logits and grads;
# the bounds leave room for GPU reduction orders and still sit orders of magnitude
# below what a wrong RoPE pairing, a missing scale or a swapped weight produces
# (0.1 to 1, see tests/test_parity.py). AdamW's first steps move each weight by about
# lr * sign(g), so weights whose gradient is at rounding level can step either way:
# the update bound is looser than the gradient bound for that reason.
TOLERANCES: dict[str, dict[str, float]] = {
    "fp32": {"logits": 1e-5, "loss": 1e-5, "grad": 5e-5, "param": 1e-5, "update": 5e-3},
    "tf32": {"logits": 5e-3, "loss": 1e-3, "grad": 2e-2, "param": 1e-4, "update": 1e-1},
    # bf16 param: 4.7e-3 measured on `large` (36 layers) on an H200; rounding grows with depth.
    "bf16": {"logits": 3e-2, "loss": 1e-2, "grad": 5e-2, "param": 1e-2, "update": 1e-1},
}


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """||a - b|| / ||b|| in float64 (0 when both are zero; inf for NaN)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return float("inf")
    denom = np.linalg.norm(b)
    num = np.linalg.norm(a - b)
    return float(num / denom) if denom else float(num)


@dataclasses.dataclass
class ParityRow:
    quantity: str  # logits, loss, grad, param, update
    tensor: str
    rel_err: float
    tol: float

    @property
    def ok(self) -> bool:
        return self.rel_err <= self.tol


@dataclasses.dataclass
class ParityResult:
    model: str
    dtype: str
    device: str
    batch: int
    ctx: int
    steps: int
    attention: dict[str, str]
    rows: list[ParityRow]
    env: dict = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    def worst(self) -> dict[str, ParityRow]:
        """The row with the largest error relative to its bound, per quantity."""
        out: dict[str, ParityRow] = {}
        for r in self.rows:
            if r.quantity not in out or r.rel_err / r.tol > out[r.quantity].rel_err / out[r.quantity].tol:
                out[r.quantity] = r
        return out

    def to_json(self) -> dict:
        return {
            "model": self.model, "dtype": self.dtype, "device": self.device, "batch": self.batch,
            "ctx": self.ctx, "steps": self.steps, "attention": self.attention, "ok": self.ok,
            "tolerances": TOLERANCES[self.dtype],
            "worst": {q: dataclasses.asdict(r) for q, r in self.worst().items()},
            "rows": [dataclasses.asdict(r) | {"ok": r.ok} for r in self.rows],
            "env": self.env,
        }


def check_parity(config: ModelConfig, *, batch: int = 2, ctx: int = 64, device: str = "cpu", dtype: str = "fp32",
                 seed: int = 0, steps: int = 5) -> ParityResult:
    """Run both models on the same weights and batch and compare them tensor by tensor
    (`config.attention` is JAX's; torch runs `backend_attention("torch", ...)` of it).
    `steps` must be at least 1: with none, the parameter and update checks compare nothing."""
    if steps < 1:
        raise ValueError(f"steps={steps}: parity needs at least one AdamW step to compare updates")
    from harness.timing.jax_backend import JaxSession
    from harness.timing.torch_backend import TorchSession, init_model

    torch_config = dataclasses.replace(config, attention=backend_attention("torch", config.attention))
    tokens = make_tokens(config.vocab_size, batch, ctx, seed)
    weights = init_model(torch_config, seed)
    jx = JaxSession(config, tokens, device=device, dtype=dtype, seed=seed, weights=weights)
    tc = TorchSession(torch_config, tokens, device=device, dtype=dtype, seed=seed, weights=weights)
    tol = TOLERANCES[dtype]
    rows = [ParityRow("logits", "logits", rel_err(jx.logits(), tc.logits()), tol["logits"])]
    loss_j, grads_j = jx.loss_and_grads()
    loss_t, grads_t = tc.loss_and_grads()
    rows.append(ParityRow("loss", "loss", rel_err(np.array(loss_j), np.array(loss_t)), tol["loss"]))
    rows += [ParityRow("grad", name, rel_err(grads_j[name], g), tol["grad"]) for name, g in grads_t.items()]
    tc.zero_grad()
    start = tc.params()
    for _ in range(steps):
        jx.forward(), jx.backward(), jx.optimizer_step()
        tc.forward(), tc.backward(), tc.optimizer_step()
    params_j, params_t = jx.params(), tc.params()
    for name, p in params_t.items():
        rows.append(ParityRow("param", name, rel_err(params_j[name], p), tol["param"]))
        rows.append(ParityRow("update", name, rel_err(params_j[name] - start[name], p - start[name]), tol["update"]))
    env = environment({"device": tc.device_name() or "cpu", **tc.versions(), **jx.versions()})
    return ParityResult(config.name, dtype, device, batch, ctx, steps,
                        {"torch": torch_config.attention, "jax": config.attention}, rows, env)


def format_table(result: ParityResult) -> str:
    """The terminal table: one line per tensor, then the verdict."""
    lines = [
        f"parity {result.model} {result.dtype} on {result.device}: batch {result.batch}, ctx {result.ctx}, "
        f"{result.steps} AdamW steps, attention torch={result.attention['torch']} jax={result.attention['jax']}",
        f"{'quantity':<8} {'tensor':<36} {'rel err':>10} {'bound':>8}  ok",
    ]
    lines += [f"{r.quantity:<8} {r.tensor:<36} {r.rel_err:>10.2e} {r.tol:>8.0e}  {'yes' if r.ok else 'NO'}"
              for r in result.rows]
    lines.append("environment: " + ", ".join(f"{k} {v}" for k, v in result.env.items()))
    failed = [r for r in result.rows if not r.ok]
    lines.append("PASS" if not failed else f"FAIL: {len(failed)} of {len(result.rows)} tensors over their bound")
    return "\n".join(lines)
