"""Run one bench pass N times (after warm-up) for an nsys trace. usage: [CHANGES='field=v,...'] bwdprof.py IMPL PASS d:seq:c|n
CHANGES (pallas_mosaic only): MosaicBlockSizes fields replaced in the cell's defaults."""
import sys, os, dataclasses
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
from harness import bench_attention as b
from pallas_kernels.flash_attention_mgpu import MosaicBlockSizes
impl, pas, spec = sys.argv[1:4]
d, seq, c = spec.split(":")
d, seq = int(d), int(seq)
cell = dict(batch=16384 // seq, seq=seq, heads=2048 // d, head_dim=d, causal=c == "c", dtype="bfloat16")
changes = {k: v == "True" if v in ("True", "False") else int(v)
           for k, v in (kv.split("=") for kv in os.environ.get("CHANGES", "").split(",") if kv)}
if impl.startswith("torch"):
    thunks, sync, _ = b._build_torch(impl, cell, "gpu")
elif changes:
    blocks = dataclasses.replace(MosaicBlockSizes.get_default(d, seq, c == "c"), **changes)
    thunks, sync, _ = b._build_jax(impl, cell, "gpu", block_sizes=blocks)
else:
    thunks, sync, _ = b._build_jax(impl, cell, "gpu")
f = thunks[pas]
for _ in range(10):
    sync(f())
out = [f() for _ in range(40)]
sync(out[-1])
