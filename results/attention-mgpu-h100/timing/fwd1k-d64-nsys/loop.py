"""Run one bench thunk N times (after warm-up) for an nsys trace. usage: loop.py IMPL true|false"""
import sys, os
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
from harness import bench_attention as b
impl, causal = sys.argv[1], sys.argv[2] == "true"
cell = dict(batch=16, seq=1024, heads=32, head_dim=64, causal=causal, dtype="bfloat16")
if impl.startswith("torch"):
    thunks, sync, _ = b._build_torch(impl, cell, "gpu")
else:
    thunks, sync, _ = b._build_jax(impl, cell, "gpu")
f = thunks["fwd"]
for _ in range(10):
    sync(f())
import time
out = [f() for _ in range(60)]
sync(out[-1])
