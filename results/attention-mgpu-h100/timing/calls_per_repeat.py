"""Diagnosis 2: host dispatch cost per call vs GPU span; wall time vs calls per repeat."""
import os, tempfile, time
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax
from harness import bench_attention as ba
from harness import framework_profile as fp

def wall(th, sync, n):
    sync(th())
    t0 = time.perf_counter()
    for _ in range(n):
        r = th()
    t1 = time.perf_counter()
    sync(r)
    t2 = time.perf_counter()
    return (t1 - t0) * 1e3 / n, (t2 - t0) * 1e3 / n

def events(th, n):
    import torch
    b, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    b.record()
    for _ in range(n):
        th()
    e.record(); e.synchronize()
    return b.elapsed_time(e) / n

CELLS = [(1024, True), (1024, False), (4096, True), (16384, False)]
for impl in ("pallas_mosaic", "jax_cudnn", "torch_sdpa_cudnn"):
    for seq, causal in CELLS:
        cell = dict(batch=16384 // seq, heads=32, seq=seq, head_dim=64, dtype="bfloat16", causal=causal)
        builder = ba._build_torch if impl.startswith("torch") else ba._build_jax
        thunks, sync, timer = builder(impl, cell, "gpu")
        for name in ("fwd", "bwd"):
            th = thunks[name]
            for _ in range(3):
                sync(th())
            parts = []
            for n in (5, 20, 100):
                d, w = wall(th, sync, n)
                parts.append(f"n={n}: disp {d:.3f} wall {w:.3f}")
                if impl.startswith("torch"):
                    parts.append(f"ev {events(th, n):.3f}")
            if not impl.startswith("torch"):
                with tempfile.TemporaryDirectory() as dd:
                    with fp.jax_profiler(dd):
                        for _ in range(50):
                            r = th()
                        sync(r)
                    ks = fp.load_jax_trace(dd).kernels
                parts.append(f"span {(ks[-1].end - ks[0].start) / 1e6 / 50:.3f} busy {sum(k.end - k.start for k in ks) / 1e6 / 50:.3f} ev/call {len(ks)/50:.1f}")
            print(f"{impl:17s} s={seq:<5d} c={causal!s:5s} {name}: " + " | ".join(parts), flush=True)
        thunks = None
        ba._release_memory()
