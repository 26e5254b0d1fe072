"""Run one bench pass N times (after warm-up) for an nsys trace. usage: bwdprof.py IMPL PASS d:seq:c|n"""
import sys, os
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
from harness import bench_attention as b
impl, pas, spec = sys.argv[1:4]
d, seq, c = spec.split(":")
d, seq = int(d), int(seq)
cell = dict(batch=16384 // seq, seq=seq, heads=2048 // d, head_dim=d, causal=c == "c", dtype="bfloat16")
if impl.startswith("torch"):
    thunks, sync, _ = b._build_torch(impl, cell, "gpu")
else:
    thunks, sync, _ = b._build_jax(impl, cell, "gpu")
f = thunks[pas]
for _ in range(10):
    sync(f())
out = [f() for _ in range(40)]
sync(out[-1])
