"""Parity of the backends: same weights, same batch, same numbers?

Eager torch is the reference. Every other backend (JAX, torch.compile with or without
CUDA graphs) starts from the same weights (torch_impl's seeded initialisation, copied
into the Flax model), sees the same token batch, and is compared with the reference by
the relative error ||other - torch|| / ||torch|| of: logits, loss, every parameter's
gradient, and after `steps` AdamW steps every parameter and every parameter's total
update (theta_N - theta_0).
The update check is the sharp one for the optimizer: parameters barely move in a few
steps, so a wrong optimizer hides in the parameters' relative error but not in the
update's. The library behind `python -m harness.parity`.
"""

from __future__ import annotations

import copy
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
# torch.compile against eager torch: the same program, but Inductor fuses ops and
# reorders float32 reductions (tiled sums, fused softmax and RMSNorm), a few 1e-7 of
# relative error per op that compounds over the layers. Measured on CPU, fp32, batch 2:
# `tiny` (2 layers, ctx 32) logits 3.3e-7, loss 1.0e-7, worst grad 6.8e-7, param 1.7e-7,
# update 4.7e-6; `mini` (4 layers, ctx 64) logits 4.1e-7, grad 9.6e-7, param 5.4e-7,
# update 1.1e-5. The bounds are ~20x the deeper model's errors, rounded up (GPU
# reductions order sums differently again), and still four orders of magnitude below
# a planted bug (0.1 to 1); the update bound stays loose for AdamW's sign-like first
# steps, as above. In tf32 and bf16 Inductor keeps fused intermediates in float32 where
# eager rounds them to the low precision (bf16 `tiny`: logits 4.0e-3, update 2.9e-2),
# the same size of difference as between torch and JAX: the JAX table's bounds.
COMPILE_TOLERANCES: dict[str, dict[str, float]] = {
    "fp32": {"logits": 1e-5, "loss": 2e-6, "grad": 2e-5, "param": 1e-5, "update": 1e-3},
    "tf32": TOLERANCES["tf32"],
    "bf16": TOLERANCES["bf16"],
}
# The backends parity compares with eager torch.
COMPARED = ("jax", "torch-compile", "torch-compile-cg")


def tolerances(backend: str, dtype: str) -> dict[str, float]:
    """The bounds for `backend` against eager torch in `dtype`."""
    return (TOLERANCES if backend == "jax" else COMPILE_TOLERANCES)[dtype]


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
    backend: str = "jax"  # the backend compared with eager torch

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
    attention: dict[str, str]  # per backend, eager torch included
    rows: list[ParityRow]
    env: dict = dataclasses.field(default_factory=dict)

    @property
    def backends(self) -> list[str]:
        return [b for b in self.attention if b != "torch"]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    def worst(self) -> dict[str, ParityRow]:
        """The row with the largest error relative to its bound, per "backend quantity"."""
        out: dict[str, ParityRow] = {}
        for r in self.rows:
            key = f"{r.backend} {r.quantity}"
            if key not in out or r.rel_err / r.tol > out[key].rel_err / out[key].tol:
                out[key] = r
        return out

    def to_json(self) -> dict:
        return {
            "model": self.model, "dtype": self.dtype, "device": self.device, "batch": self.batch,
            "ctx": self.ctx, "steps": self.steps, "attention": self.attention, "ok": self.ok,
            "tolerances": {b: tolerances(b, self.dtype) for b in self.backends},
            "worst": {q: dataclasses.asdict(r) for q, r in self.worst().items()},
            "rows": [dataclasses.asdict(r) | {"ok": r.ok} for r in self.rows],
            "env": self.env,
        }


def check_parity(config: ModelConfig, *, batch: int = 2, ctx: int = 64, device: str = "cpu", dtype: str = "fp32",
                 seed: int = 0, steps: int = 5, backends: tuple[str, ...] = ("jax",)) -> ParityResult:
    """Run eager torch and each of `backends` (from COMPARED) on the same weights and batch
    and compare them tensor by tensor (`config.attention` is JAX's; the torch backends run
    `backend_attention("torch", ...)` of it). One backend's session lives at a time.
    `steps` must be at least 1: with none, the parameter and update checks compare nothing."""
    if steps < 1:
        raise ValueError(f"steps={steps}: parity needs at least one AdamW step to compare updates")
    from harness.timing.torch_backend import TorchSession, init_model

    torch_config = dataclasses.replace(config, attention=backend_attention("torch", config.attention))
    tokens = make_tokens(config.vocab_size, batch, ctx, seed)
    weights = init_model(torch_config, seed)
    reference = TorchSession(torch_config, tokens, device=device, dtype=dtype, seed=seed,
                             weights=copy.deepcopy(weights))
    ref = _values(reference, steps)
    env = {"device": reference.device_name() or "cpu", **reference.versions()}
    del reference
    rows = []
    for backend in backends:
        session = _session(backend, config, torch_config, tokens, device, dtype, seed, weights)
        got = _values(session, steps)
        env.update(session.versions())
        del session
        tol = tolerances(backend, dtype)
        rows += [ParityRow("logits", "logits", rel_err(got["logits"], ref["logits"]), tol["logits"], backend),
                 ParityRow("loss", "loss", rel_err(np.array(got["loss"]), np.array(ref["loss"])), tol["loss"], backend)]
        rows += [ParityRow("grad", name, rel_err(got["grads"][name], g), tol["grad"], backend)
                 for name, g in ref["grads"].items()]
        for name, p in ref["params"].items():
            start = ref["start"][name]
            rows.append(ParityRow("param", name, rel_err(got["params"][name], p), tol["param"], backend))
            rows.append(ParityRow("update", name, rel_err(got["params"][name] - start, p - start), tol["update"],
                                  backend))
    attention = {"torch": torch_config.attention} | {b: backend_attention(b, config.attention) for b in backends}
    return ParityResult(config.name, dtype, device, batch, ctx, steps, attention, rows, environment(env))


def _session(backend: str, config: ModelConfig, torch_config: ModelConfig, tokens: np.ndarray, device: str,
             dtype: str, seed: int, weights):
    common = dict(device=device, dtype=dtype, seed=seed)
    if backend == "jax":
        from harness.timing.jax_backend import JaxSession

        return JaxSession(config, tokens, **common, weights=weights)
    from harness.timing.torch_backend import TorchCompileSession

    # a copy: on the CPU, .to(device) keeps the module, and training would move the shared weights
    return TorchCompileSession(torch_config, tokens, **common, weights=copy.deepcopy(weights), backend=backend)


def _values(session, steps: int) -> dict:
    """Logits, loss and gradients at the start; parameters at the start and after `steps` AdamW steps."""
    logits = session.logits()
    loss, grads = session.loss_and_grads()
    session.zero_grad()
    start = session.params()
    for _ in range(steps):
        session.forward(), session.backward(), session.optimizer_step()
    return {"logits": logits, "loss": loss, "grads": grads, "start": start, "params": session.params()}


def format_table(result: ParityResult) -> str:
    """The terminal table: one line per tensor, then the verdict."""
    attention = " ".join(f"{b}={a}" for b, a in result.attention.items())
    lines = [
        f"parity {result.model} {result.dtype} on {result.device}: batch {result.batch}, ctx {result.ctx}, "
        f"{result.steps} AdamW steps, each backend against eager torch, attention {attention}",
        f"{'backend':<16} {'quantity':<8} {'tensor':<36} {'rel err':>10} {'bound':>8}  ok",
    ]
    lines += [f"{r.backend:<16} {r.quantity:<8} {r.tensor:<36} {r.rel_err:>10.2e} {r.tol:>8.0e}  "
              f"{'yes' if r.ok else 'NO'}" for r in result.rows]
    lines.append("environment: " + ", ".join(f"{k} {v}" for k, v in result.env.items()))
    failed = [r for r in result.rows if not r.ok]
    lines.append("PASS" if not failed else f"FAIL: {len(failed)} of {len(result.rows)} tensors over their bound")
    return "\n".join(lines)
