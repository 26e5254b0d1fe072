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

import dataclasses

import numpy as np

from harness.backends import backend_attention, other_frameworks, reference
from harness.backends import compared as compared_backends
from harness.backends import get as backend_record
from harness.common.results import environment
from harness.config import ModelConfig


def tolerances(backend: str, dtype: str) -> dict[str, float]:
    """The bounds for `backend` against the reference backend in `dtype` (`Backend.tolerances`)."""
    return backend_record(backend).tolerances[dtype]


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
    backend: str  # the backend compared with the reference

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
    attention: dict[str, str]  # per backend, the reference (eager torch) first
    rows: list[ParityRow]
    env: dict = dataclasses.field(default_factory=dict)

    @property
    def backends(self) -> list[str]:
        """The backends compared with the reference (the first of `attention`)."""
        return list(self.attention)[1:]

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
                 seed: int = 0, steps: int = 5, backends: tuple[str, ...] | None = None) -> ParityResult:
    """Run the reference backend (eager torch) and each of `backends` (`harness.backends.compared`;
    None: those of another framework, `harness.backends.other_frameworks`: JAX) on the same
    weights and batch and compare them tensor by tensor (`config.attention` is asked of all;
    each runs `backend_attention` of it). One backend's session lives at a time.
    `steps` must be at least 1: with none, the parameter and update checks compare nothing."""
    if steps < 1:
        raise ValueError(f"steps={steps}: parity needs at least one AdamW step to compare updates")
    from harness.timing.runner import make_session
    from harness.timing.spec import RunSpec

    def session(backend: str):
        return make_session(RunSpec(backend=backend, model=config.name, ctx=ctx, batch=batch, dtype=dtype,
                                       attention=config.attention, device=device, seed=seed), config)

    if backends is None:
        backends = tuple(b for b in compared_backends() if b in other_frameworks())
    reference_name = reference()
    reference_session = session(reference_name)
    ref = _values(reference_session, steps)
    env = {"device": reference_session.device_name() or "cpu", **reference_session.versions()}
    del reference_session
    rows = []
    for backend in backends:
        compared = session(backend)
        got = _values(compared, steps)
        env.update(compared.versions())
        del compared
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
    attention = {b: backend_attention(b, config.attention) for b in (reference_name, *backends)}
    return ParityResult(config.name, dtype, device, batch, ctx, steps, attention, rows, environment(env))


def _values(session, steps: int) -> dict:
    """Logits, loss and gradients at the start; parameters at the start and after `steps` AdamW steps."""
    logits = session.logits()
    loss, grads = session.loss_and_grads()
    session.zero_grad()
    start = session.params()
    for _ in range(steps):
        session.forward(), session.backward(), session.optimizer_step()
    return {"logits": logits, "loss": loss, "grads": grads, "start": start, "params": session.params()}


def verdict(result: ParityResult) -> str:
    """PASS or FAIL, with the tensors over their bound or, where none is, the one closest to it."""
    failed = [r for r in result.rows if not r.ok]
    if failed:
        named = ", ".join(f"{r.backend} {r.quantity} {r.tensor} {r.rel_err:.1e} (bound {r.tol:.0e})"
                          for r in failed[:3])
        return f"FAIL: {len(failed)} of {len(result.rows)} tensors over their bound: {named}" + (
            ", ..." if len(failed) > 3 else "")
    if not result.rows:
        return "PASS: no tensor compared"
    r = max(result.rows, key=lambda r: r.rel_err / r.tol)
    n = len(result.rows)
    every = f"all {n} tensors within their bounds" if n > 1 else "the one tensor within its bound"
    return (f"PASS: {every}; the closest to its bound: {r.backend} {r.quantity} {r.tensor}, {r.rel_err:.1e} "
            f"against {r.tol:.0e}")


def format_table(result: ParityResult) -> str:
    """The terminal table: what was compared, the verdict, one line per tensor, the environment."""
    attention = " ".join(f"{b}={a}" for b, a in result.attention.items())
    lines = [
        f"parity {result.model} {result.dtype} on {result.device}: batch {result.batch}, ctx {result.ctx}, "
        f"{result.steps} AdamW steps, each backend against eager torch, attention {attention}",
        verdict(result),
        f"{'backend':<16} {'quantity':<8} {'tensor':<36} {'rel err':>10} {'bound':>8}  ok",
    ]
    lines += [f"{r.backend:<16} {r.quantity:<8} {r.tensor:<36} {r.rel_err:>10.2e} {r.tol:>8.0e}  "
              f"{'yes' if r.ok else 'NO'}" for r in result.rows]
    lines.append("environment: " + ", ".join(f"{k} {v}" for k, v in result.env.items()))
    return "\n".join(lines)
