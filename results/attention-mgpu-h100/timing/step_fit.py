"""Fits time = fixed + per_step * steps to one pass of the FA3 cells of a target run, per
implementation. Every FA3 shape has batch*seq = 16384 tokens, so a key tile's loop
has seq/64 query steps and the number of tiles is the same at every length: the
slope is the cost of one step of every tile, the intercept what does not grow with
the length (the passes around the kernel, each tile's start and end).
usage: python step_fit.py HEAD_DIM causal|non-causal fwd|bwd RUN.json ..."""
import json
import sys

import numpy as np

head_dim, causal, pass_ = int(sys.argv[1]), sys.argv[2] == "causal", sys.argv[3]
rows = [r for f in sys.argv[4:] for r in json.load(open(f))["results"]
        if r["head_dim"] == head_dim and r["causal"] == causal and r["status"] == "ok"
        and r["batch"] * r["seq"] == 16384]
fits = {}
for impl in sorted({r["impl"] for r in rows}):
    pts = sorted((r["seq"] // 64, r[f"{pass_}_ms"]) for r in rows if r["impl"] == impl)
    steps, ms = np.array(pts, dtype=float).T
    per_step, fixed = np.polyfit(steps, ms, 1)
    worst = float(np.max(np.abs(fixed + per_step * steps - ms) / ms))
    fits[impl] = (per_step, fixed)
    print(f"{impl:18s} seq {','.join(str(int(s) * 64) for s in steps)}: per step {per_step * 1e3:.2f} us, "
          f"fixed {fixed * 1e3:.0f} us, largest residual {worst:.2%}")
if "pallas_mosaic" in fits:
    ours = fits["pallas_mosaic"][0]
    for impl, (per_step, _) in fits.items():
        if impl != "pallas_mosaic":
            print(f"pallas_mosaic per step / {impl}: {ours / per_step:.3f}")
