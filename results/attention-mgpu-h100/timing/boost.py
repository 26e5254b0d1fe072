"""bwd calls back to back (at the power cap), then one at a time with idle gaps (boost clocks), for nsys. usage: boost.py IMPL d:seq:c|n"""
import sys, os, time
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
from harness import bench_attention as b
impl, spec = sys.argv[1:3]
d, seq, c = spec.split(":"); d, seq = int(d), int(seq)
cell = dict(batch=16384 // seq, seq=seq, heads=2048 // d, head_dim=d, causal=c == "c", dtype="bfloat16")
thunks, sync, _ = (b._build_torch if impl.startswith("torch") else b._build_jax)(impl, cell, "gpu")
f = thunks["bwd"]
for _ in range(5):
    sync(f())
t_end = time.time() + 2.0
while time.time() < t_end:
    for _ in range(10):
        r = f()
    sync(r)
for _ in range(20):
    time.sleep(0.05)
    sync(f())
