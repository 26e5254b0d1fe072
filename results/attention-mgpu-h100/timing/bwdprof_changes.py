"""bwdprof.py with MosaicBlockSizes changes from CHANGES='field=v,...' (pallas_mosaic only)."""
import sys, os, dataclasses
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
from harness import bench_attention as b
from pallas_kernels.flash_attention_mgpu import MosaicBlockSizes
impl, pas, spec = sys.argv[1:4]
d, seq, c = spec.split(":")
d, seq = int(d), int(seq)
cell = dict(batch=16384 // seq, seq=seq, heads=2048 // d, head_dim=d, causal=c == "c", dtype="bfloat16")
ch = {kv.split("=")[0]: kv.split("=")[1] == "True" if kv.split("=")[1] in ("True", "False") else int(kv.split("=")[1])
      for kv in os.environ.get("CHANGES", "").split(",") if kv}
blocks = dataclasses.replace(MosaicBlockSizes.get_default(d, seq, c == "c"), **ch)
thunks, sync, _ = b._build_jax(impl, cell, "gpu", block_sizes=blocks)
f = thunks[pas]
for _ in range(10):
    sync(f())
out = [f() for _ in range(40)]
sync(out[-1])
