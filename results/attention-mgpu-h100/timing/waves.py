"""Backward time per call against the number of key tiles, to see whether the
one-program-per-tile backward pays for its last, partial wave of programs.
usage: waves.py impl,impl d:seq:batch:heads:c|n ...
Prints each cell's median (min-max) ms per implementation, interleaved in
rounds with the bench's lead-in (harness.bench_attention.time_interleaved),
and the key tiles of 128 keys (2 consumers x 64) over the SM count."""
import os, sys
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax
from harness import bench_attention as ba

IMPLS = sys.argv[1].split(",")
SMS = jax.devices()[0].core_count
for spec in sys.argv[2:]:
    d, seq, batch, heads, c = spec.split(":")
    cell = dict(batch=int(batch), heads=int(heads), seq=int(seq), head_dim=int(d), dtype="bfloat16",
                causal=c == "c")
    entries = {}
    for impl in IMPLS:
        builder = ba._build_torch if impl.startswith("torch") else ba._build_jax
        thunks, sync, timer = builder(impl, cell, "gpu")
        entries[impl] = (thunks["bwd"], sync, timer)
    got = ba.time_interleaved(entries, warmup=2, iters=11, min_batch_ms=25, lead_in_ms=200)
    tiles = cell["batch"] * cell["heads"] * cell["seq"] // 128
    print(f"{spec}: {tiles} tiles of 128 keys = {tiles / SMS:.2f} waves on {SMS} SMs | " + " | ".join(
        f"{k} {v[0]:.4f} ms ({v[1]:.4f}-{v[2]:.4f})" if not isinstance(v, Exception) else f"{k} FAILED {v}"
        for k, v in got.items()), flush=True)
    ba._release_memory()
