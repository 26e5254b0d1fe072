"""The training step's GEMMs, each timed with the kernel torch runs, the one XLA chooses and every
other candidate cuBLASLt offers, at the power cap.

The same bf16 matmul runs different cuBLAS kernels in the two frameworks: torch's matmul runs
the first algorithm of cuBLASLt's heuristic, XLA's autotuner times the heuristic's candidates
when it compiles and keeps the fastest (`harness.timing.cublaslt`). `measure` sets them side by
side for each GEMM of a model's step (`gemm_problems`: the linear layers' forward, input
gradient and weight gradient at the step's token count): torch's `mm`, every candidate through
cuBLASLt, and XLA's own compiled call, each run back to back for a while first, so that the GPU
holds its power cap as it does through a training step, then timed over as long again with the
energy NVML counts and the SM clock it held. A kernel that wins a short burst at the boost clock
can lose under the cap. The rounds rotate the order. `summarize` turns a document into the
figures its report gives (medians and ranges over the rounds, the step's totals); rendering is
`harness.reports.gemms`.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from harness.common.spread import spread
from harness.config import ModelConfig

PASSES = ("fwd", "dgrad", "wgrad")
LAYERS = ("q/k/v/o", "w1/w3", "w2", "lm_head")
BATCH_CALLS = 8  # calls enqueued between waits; the next batch is queued before the last one is waited on


@dataclass(frozen=True)
class Gemm:
    """One GEMM of the step: row-major D[m, n] = A[m, k] @ B[k, n], run `per_step` times a step.

    A linear layer with weight W [n_out, n_in] over x [tokens, n_in] runs forward x W^T, its input
    gradient g W (g the output's gradient [tokens, n_out]) and its weight gradient g^T x."""

    layer: str
    pass_name: str
    m: int
    n: int
    k: int
    per_step: int

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def key(self) -> str:
        return f"{self.layer} {self.pass_name}"


def gemm_problems(config: ModelConfig, batch: int, ctx: int, layers=LAYERS, passes=PASSES) -> list[Gemm]:
    """The step's GEMMs of the linear layers (the attention products are the fused kernel's), per
    layer kind and pass, with how often each runs in one step."""
    tokens, d, f, L, V = batch * ctx, config.d_model, config.d_ff, config.num_layers, config.vocab_size
    shapes = {"q/k/v/o": (d, d, 4 * L), "w1/w3": (d, f, 2 * L), "w2": (f, d, L), "lm_head": (d, V, 1)}
    out = []
    for layer in layers:
        n_in, n_out, count = shapes[layer]
        dims = {"fwd": (tokens, n_out, n_in), "dgrad": (tokens, n_in, n_out), "wgrad": (n_out, n_in, tokens)}
        out += [Gemm(layer, p, *dims[p], count) for p in passes]
    return out


# -- on the GPU -------------------------------------------------------------------------------
def _operands(g: Gemm, generator):
    """Seeded bf16 operands of `g` as the layer computes it: (a, b) with a @ b the product."""
    import torch

    tokens = g.m if g.pass_name != "wgrad" else g.k
    n_in = {"fwd": g.k, "dgrad": g.n, "wgrad": g.n}[g.pass_name]
    n_out = {"fwd": g.n, "dgrad": g.k, "wgrad": g.m}[g.pass_name]
    x = torch.randn(tokens, n_in, device="cuda", generator=generator).to(torch.bfloat16)
    w = (0.02 * torch.randn(n_out, n_in, device="cuda", generator=generator)).to(torch.bfloat16)
    grad = torch.randn(tokens, n_out, device="cuda", generator=generator).to(torch.bfloat16)
    return {"fwd": (x, w.t()), "dgrad": (grad, w), "wgrad": (grad.t(), x)}[g.pass_name]


def _xla_function(pass_name: str):
    """The pass as JAX writes it on the same operands (x, W, g as the layer holds them)."""
    return {"fwd": lambda x, w: x @ w.T, "dgrad": lambda g, w: g @ w, "wgrad": lambda g, x: g.T @ x}[pass_name]


def xla_choice(hlo_text: str) -> dict:
    """What XLA compiled a lone dot to: the cuBLASLt candidate its autotuner selected, or, where it
    made the dot something else (a fusion of its own, split-K), that op's name."""
    import re

    for line in hlo_text.splitlines():
        if "custom_call_target=\"__cublas$lt$matmul\"" in line or "custom_call_target=\"__cublas$gemm\"" in line:
            target = "cublaslt" if "$lt$" in line else "cublas"
            found = re.search(r'"selected_algorithm":"(-?\d+)"', line)
            return {"kind": target, "candidate": int(found.group(1)) if found else None}
    for line in hlo_text.splitlines():
        if line.lstrip().startswith("ROOT") or " fusion(" in line:
            op = re.search(r"%([\w.\-]+) = ", line)
            if op and ("fusion" in line or "custom-call" in line):
                return {"kind": "other", "op": op.group(1)}
    return {"kind": "other", "op": None}


class _Energy:
    """The GPU's energy counter (mJ) and SM clock through NVML, or None where NVML is missing."""

    def __init__(self, device: int) -> None:
        from harness.timing.clocks import open_sampler

        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        sampler = open_sampler([device], visible.split(",") if visible else None)
        self.why_not = sampler if isinstance(sampler, str) else None
        self.nvml, self.handle = (None, None) if self.why_not else (sampler.nvml, sampler.handles[0])

    def energy_mj(self) -> int | None:
        try:
            return int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)) if self.nvml else None
        except Exception:  # an NVML without the counter on this GPU
            return None

    def clock_mhz(self) -> int | None:
        return int(self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_SM)) if self.nvml else None


def sustained(enqueue: Callable[[], object], wait: Callable[[object], None], seconds: float,
              meter: _Energy) -> dict:
    """Per-call time, energy and SM clock of a call run back to back: `seconds` untimed (the GPU
    reaches its power cap), then `seconds` timed. `enqueue` queues BATCH_CALLS calls and returns
    what `wait` waits on; the next batch is queued before the last is waited on, so the GPU
    never idles between calls."""
    def loop(until: float) -> tuple[int, list[int]]:
        calls, clocks, last = 0, [], None
        while time.perf_counter() < until or last is None:
            current = enqueue()
            if last is not None:
                wait(last)
                if (mhz := meter.clock_mhz()) is not None:
                    clocks.append(mhz)
            last, calls = current, calls + BATCH_CALLS
        wait(last)
        return calls, clocks

    loop(time.perf_counter() + seconds)
    e0, t0 = meter.energy_mj(), time.perf_counter()
    calls, clocks = loop(t0 + seconds)
    elapsed, e1 = time.perf_counter() - t0, meter.energy_mj()
    return {"us": round(elapsed / calls * 1e6, 2), "calls": calls,
            "mj": round((e1 - e0) / calls, 3) if e0 is not None and e1 is not None else None,
            "mhz": statistics.median(clocks) if clocks else None}


def _kernel_names(calls: list[Callable[[], object]]) -> list[str]:
    """The CUDA kernels each call launches (names joined by ' + '), from one profiled pass in
    which a marker kernel precedes each call."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    marker = torch.zeros(1, device="cuda")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for call in calls:
            marker.fill_(7.0)
            call()
            torch.cuda.synchronize()
    groups: list[list[str]] = []
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    for e in sorted(events, key=lambda e: e.time_range.start):
        if "FillFunctor" in e.name:
            groups.append([])
        elif groups and not e.name.startswith("Memset"):
            groups[-1].append(e.name)
    return [" + ".join(names) for names in groups] + [""] * (len(calls) - len(groups))


def measure(problems: list[Gemm], rounds: int, seconds: float, say: Callable[[str], None],
            done: list[dict]) -> None:
    """Each problem's entry appended to `done` as it finishes (a stop keeps the finished ones):
    the candidates (index, waves, kernel), torch's kernel, XLA's choice, and per round the
    sustained figures of torch's `mm` ("mm"), each candidate (its index) and XLA's own call
    ("xla_call")."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX shares the GPU with torch here
    import jax
    import torch

    from harness.timing.cublaslt import Lt, gemm_problem, operand_layout, transposes

    lt = Lt()
    meter = _Energy(torch.cuda.current_device())
    generator = torch.Generator(device="cuda").manual_seed(0)
    for g in problems:
        say(f"{g.key}: {g.m} x {g.n} x {g.k}")
        a, b = _operands(g, generator)
        out = torch.empty(g.m, g.n, dtype=torch.bfloat16, device="cuda")
        la = operand_layout(tuple(a.shape), tuple(a.stride()))
        lb = operand_layout(tuple(b.shape), tuple(b.stride()))
        problem = gemm_problem(la, lb, g.m, g.n, g.k)
        plan, candidates = lt.candidates(problem)
        reference = torch.mm(a, b).float()
        scale = reference.abs().max().item()

        def run(c, a=a, b=b, out=out, plan=plan):
            return lt.matmul(plan, c, a, b, out)

        usable = []
        for c in candidates:
            if run(c) == 0:
                torch.cuda.synchronize()
                usable.append((c, (out.float() - reference).abs().max().item() / scale))
        names = _kernel_names([lambda a=a, b=b: torch.mm(a, b)] + [lambda c=c: run(c) for c, _ in usable])

        x_like = [_to_jax(t.contiguous()) for t in _xla_operands(g.pass_name, a, b)]
        compiled = jax.jit(_xla_function(g.pass_name)).lower(*x_like).compile()  # XLA autotunes here
        choice = xla_choice(compiled.as_text())

        entries: dict[str, tuple[Callable[[], object], Callable[[object], None]]] = {
            "mm": _torch_enqueue(lambda a=a, b=b: torch.mm(a, b)),
            **{str(c.index): _torch_enqueue(lambda c=c: run(c)) for c, _ in usable},
            "xla_call": _jax_enqueue(compiled, x_like),
        }
        order = list(entries)
        timed: list[dict] = []
        for r in range(rounds):
            shift = r % len(order)
            timed.append({name: sustained(*entries[name], seconds, meter) for name in order[shift:] + order[:shift]})
        done.append({
            "layer": g.layer, "pass": g.pass_name, "m": g.m, "n": g.n, "k": g.k, "per_step": g.per_step,
            "transposes": transposes(problem), "torch_kernel": names[0],
            "candidates": [{"index": c.index, "waves": round(c.waves, 3), "kernel": name, "max_rel_diff": round(err, 6)}
                           for (c, err), name in zip(usable, names[1:])],
            "xla": choice, "rounds": timed,
            **({"energy": meter.why_not} if meter.why_not else {}),
        })
        del a, b, out, reference, x_like


def _xla_operands(pass_name: str, a, b) -> tuple:
    """The layer's own tensors behind (a, b): x, W and g as the JAX function takes them."""
    return {"fwd": (a, b.t()), "dgrad": (a, b), "wgrad": (a.t(), b)}[pass_name]


def _to_jax(t):
    """A torch CUDA tensor as a JAX array on the same GPU: shared through DLPack, or copied
    through the host where this JAX cannot take it."""
    import jax
    import jax.numpy as jnp

    try:
        return jax.dlpack.from_dlpack(t)
    except Exception:  # DLPack versions differ between releases; the values are what matter
        return jnp.asarray(t.float().cpu().numpy()).astype(jnp.bfloat16)


def _torch_enqueue(call: Callable[[], object]):
    import torch

    def enqueue():
        for _ in range(BATCH_CALLS):
            call()
        event = torch.cuda.Event()
        event.record()
        return event

    return enqueue, lambda event: event.synchronize()


def _jax_enqueue(fn, args):
    def enqueue():
        out = None
        for _ in range(BATCH_CALLS):
            out = fn(*args)
        return out

    return enqueue, lambda out: out.block_until_ready()


# -- the figures of a document -----------------------------------------------------------------
def _entry(rounds: list[dict], name: str) -> dict:
    """One timed entry over the rounds: its time's median and range (`spread`), the rounds'
    count, and the median energy per call and SM clock where NVML gave them."""
    us = [r[name]["us"] for r in rounds if name in r]
    mj, mhz = ([r[name][k] for r in rounds if r.get(name, {}).get(k) is not None] for k in ("mj", "mhz"))
    s = spread(dict(enumerate(us)))
    return {"median": s["median"], "min": s["min"], "max": s["max"], "n": len(us),
            "mj": statistics.median(mj) if mj else None, "mhz": statistics.median(mhz) if mhz else None}


def summarize(doc: dict) -> dict:
    """Per GEMM: torch's kernel and which candidate it is, XLA's choice, and the medians (with
    ranges) over the rounds of torch's `mm`, XLA's choice run as the others are (XLA's own call
    where its choice is no candidate), XLA's own call and the fastest candidate; then the step's
    totals (each GEMM's median times its count)."""
    rows = []
    for p in doc["problems"]:
        by = {name: _entry(p["rounds"], name) for name in p["rounds"][0]}
        kernels = {str(c["index"]): c["kernel"] for c in p["candidates"]}
        picked = str(p["xla"].get("candidate"))
        xla_key = picked if p["xla"].get("kind") == "cublaslt" and picked in kernels else None
        best = min(kernels, key=lambda k: by[k]["median"]) if kernels else None
        rows.append({
            "layer": p["layer"], "pass": p["pass"], "shape": (p["m"], p["n"], p["k"]), "per_step": p["per_step"],
            "mm": {"kernel": p["torch_kernel"],
                   "candidate": next((c["index"] for c in p["candidates"] if c["kernel"] == p["torch_kernel"]), None),
                   **by["mm"]},
            "xla": {"kernel": kernels[xla_key] if xla_key else p["xla"].get("op") or p["xla"].get("kind"),
                    "candidate": int(xla_key) if xla_key else None, **by[xla_key or "xla_call"]},
            "xla_call": by["xla_call"],
            "best": {"kernel": kernels[best], "candidate": int(best), **by[best]} if best else None,
            "xla_over_mm": by[xla_key or "xla_call"]["median"] / by["mm"]["median"],
        })
    totals = {side: sum(r[side]["median"] * r["per_step"] for r in rows) / 1e3 for side in ("mm", "xla")}
    totals["best"] = sum((r["best"] or r["mm"])["median"] * r["per_step"] for r in rows) / 1e3
    return {"rows": rows, "step_ms": totals,
            "mm_first": sum(r["mm"]["candidate"] == 0 for r in rows),
            "xla_other": sum(r["xla"]["candidate"] not in (None, 0) for r in rows),
            "xla_not_cublaslt": sum(r["xla"]["candidate"] is None for r in rows)}
