"""One tile variant of an epilogue kernel in its own process (a kernel that faults takes only
its own process down): correctness against the reference at a small and the step's shape,
then its time against XLA's, interleaved. `python variant.py up|down rows tile_n stages bufs
tile_k in_flight pingpong`."""

import json
import sys

import jax
from check_common import err, inputs, timed, xla_down, xla_up

from pallas_kernels import swiglu as sw
from pallas_kernels.hopper import gated

kind, *fields = sys.argv[1:]
tiles = gated.GemmTiles(*(int(f) if f.isdigit() else f == "True" for f in fields))
if kind == "up":
    fn = jax.jit(lambda x, w1, w3: gated._gemm_call(
        x, (w1, w3), transpose_b=True, n_out=3, epilogue=gated._up_epilogue, name="u", tiles=tiles))
else:
    fn = jax.jit(lambda dy, w2, h1, h3: gated._gemm_call(
        dy, (w2,), transpose_b=False, n_out=3, epilogue=gated._down_epilogue, epi_inputs=(h1, h3), name="d",
        tiles=tiles))
out = dict(kind=kind, tiles=[int(f) if f.isdigit() else f == "True" for f in fields])
for m, d, f in ((256, 128, 256), (32768, 1280, 5120)):
    x, w1, w2, w3, dy = inputs(m, d, f)
    h1, h3, _ = sw.gate_up_reference(x, w1, w3)
    args = (x, w1, w3) if kind == "up" else (dy, w2, h1, h3)
    ref = sw.gate_up_reference(*args) if kind == "up" else sw.gate_down_reference(*args)
    out[f"rel_err_{m}"] = [err(a, b) for a, b in zip(fn(*args), ref)]
xla = jax.jit(xla_up if kind == "up" else xla_down)
for r in range(3):
    out[f"us_{r}"] = timed(fn, *args)
    out[f"xla_us_{r}"] = timed(xla, *args)
print(json.dumps(out), flush=True)
