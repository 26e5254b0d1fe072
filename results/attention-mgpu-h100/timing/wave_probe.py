"""Wave-quantization probe: backward time against heads (items = heads*seq/128 CTAs)."""
import os, sys
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax, jax.numpy as jnp
from harness import bench_attention as bench
cells = [(int(d), int(s), c == "c", [int(h) for h in hs.split(",")]) for d, s, c, hs in (x.split(":") for x in sys.argv[1:])]
impls = os.environ.get("IMPLS", "pallas_mosaic,torch_sdpa_cudnn").split(",")
for d, seq, causal, heads in cells:
    entries = {}
    for h in heads:
        cell = dict(batch=16384 // seq if h == 0 else 1, heads=h or 2048 // d, seq=seq, head_dim=d, dtype="bfloat16", causal=causal)
        for impl in impls:
            b = bench._build_torch if impl.startswith("torch") else bench._build_jax
            thunks, sync, timer = b(impl, cell, "gpu")
            entries[(h, impl)] = (thunks["bwd"], sync, timer)
    got = bench.time_interleaved(entries, warmup=2, iters=int(os.environ.get("ITERS", "11")), min_batch_ms=25, lead_in_ms=200)
    for (h, impl), t in got.items():
        print(f"d={d} seq={seq} causal={causal} heads={h} {impl}: {t[0]:.4f} ms [{t[1]:.4f},{t[2]:.4f}]  per-head {t[0]/(h or 2048//d):.5f}", flush=True)
    entries = None; bench._release_memory()
