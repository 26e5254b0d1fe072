"""Per-pass ratios (fastest reference time / ours) of the target runs side by side, head_dim 128
(or 64 with the argument 64). usage (repository root): python results/attention-mgpu-h100/hd128_runs.py [64]"""
import json
import sys
from pathlib import Path

from harness import attention_targets

HERE = Path(__file__).parent
RUNS = [("06d22c7 (run 2)", "fa3-hd128-bf16-run2.json"), ("648db8d", "fa3-hd128-bf16-overlap.json"),
        ("380b30c", "fa3-hd128-bf16-l2order.json"), ("1061937", "fa3-hd128-bf16-grid.json"),
        ("81e586d", "fa3-hd128-bf16-persistent-all.json")]
if sys.argv[1:] == ["64"]:
    RUNS = [("06d22c7 (run 2)", "fa3-hd64-bf16-run2.json"), ("648db8d", "fa3-hd64-bf16-overlap.json"),
            ("1061937", "fa3-hd64-bf16-grid.json")]
ratios = [{(r["seq"], r["causal"], r["pass"]): r["speedup"]
           for r in attention_targets.check_hopper(json.loads((HERE / f).read_text())["results"])} for _, f in RUNS]
print("| seq | causal | " + " | ".join(f"fwd {n}" for n, _ in RUNS) + " | " + " | ".join(f"bwd {n}" for n, _ in RUNS) + " |")
print("|---|---|" + "---|" * 2 * len(RUNS))
for seq in (1024, 2048, 4096, 8192, 16384):
    for causal in (True, False):
        cells = [f"{r[(seq, causal, p)]:.2f}" for p in ("fwd", "bwd") for r in ratios]
        print(f"| {seq} | {'yes' if causal else 'no'} | " + " | ".join(cells) + " |")
