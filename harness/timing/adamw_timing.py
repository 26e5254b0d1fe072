"""AdamW step time on a model's parameters: the per-parameter loop against the foreach
implementation, the compiled foreach and the fused kernel, measured in the same run.

Each variant gets its own copy of the parameters with fixed gradients; after warm-up
the variants take their timed steps in rotating rounds (so drift falls on all of
them), each step ended by a device synchronization. The figure is the median step
time, with the achieved bandwidth at the 28 bytes per parameter an AdamW step moves
(`harness.timing.flops.optimizer_bytes`) and each variant's speed-up over the loop.
"""

from __future__ import annotations

import statistics
import time

from harness.common.documents import BENCH_OPTIMIZER_SCHEMA
from harness.config import ModelConfig
from harness.timing.flops import optimizer_bytes

VARIANTS = {"loop": {"foreach": False}, "foreach": {"foreach": True},
            "foreach-compiled": {"foreach": True, "compile": True}, "fused": {"fused": True}}


def bench_optimizer(config: ModelConfig, device: str, variants: list[str], warmup: int = 3,
                    steps: int = 10) -> dict:
    """Median AdamW step time per variant; the result document of `harness.bench_optimizer`."""
    import torch

    import torch_impl

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    model = torch_impl.TransformerLM(config).to(device)
    grads = [torch.randn_like(p) * 1e-3 for p in model.parameters()]
    opts = {}
    for name in variants:
        params = [torch.nn.Parameter(p.detach().clone()) for p in model.parameters()]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opts[name] = torch_impl.AdamW(params, **VARIANTS[name])
    del model
    first = {}
    for name, opt in opts.items():
        t0 = time.perf_counter()
        for _ in range(warmup):
            opt.step()
        sync()
        first[name] = (time.perf_counter() - t0) * 1e3
    times: dict[str, list[float]] = {name: [] for name in opts}
    for _ in range(steps):
        for name, opt in opts.items():
            t0 = time.perf_counter()
            opt.step()
            sync()
            times[name].append((time.perf_counter() - t0) * 1e3)
    moved = optimizer_bytes(config)
    base = statistics.median(times["loop"]) if "loop" in times else None
    out = {}
    for name, ts in times.items():
        med = statistics.median(ts)
        out[name] = {"median_ms": med, "min_ms": min(ts), "max_ms": max(ts), "times_ms": ts,
                     "warmup_ms": first[name], "gb_per_s": moved / (med / 1e3) / 1e9,
                     "speedup_over_loop": base / med if base else None}
    return {"schema": BENCH_OPTIMIZER_SCHEMA, "num_params": config.num_params, "bytes_per_step": moved,
            "warmup": warmup, "steps": steps, "variants": out}


def format_result(doc: dict, hbm_gb_per_s: float | None) -> str:
    lines = [f"AdamW on {doc['num_params']:,} parameters ({doc['bytes_per_step'] / 1e9:.2f} GB per step), "
             f"median of {doc['steps']} steps after {doc['warmup']}",
             f"{'variant':<18} {'median ms':>10} {'GB/s':>8} {'of HBM':>7} {'x loop':>7}"]
    for name, r in doc["variants"].items():
        hbm = f"{100 * r['gb_per_s'] / hbm_gb_per_s:.0f}%" if hbm_gb_per_s else "-"
        speed = f"{r['speedup_over_loop']:.2f}x" if r["speedup_over_loop"] else "-"
        lines.append(f"{name:<18} {r['median_ms']:>10.3f} {r['gb_per_s']:>8.0f} {hbm:>7} {speed:>7}")
    return "\n".join(lines)
