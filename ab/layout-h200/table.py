"""The A/B's table, from the documents beside it: python ab/layout-h200/table.py"""
import glob
import json
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
print("| cell | before (59aade3) | after (0472e4d) |\n|---|---|---|")
for backend, phase in (("torch", "step"), ("torch-compile", "step"), ("jax", "step"), ("jax", "fused_step")):
    row = {}
    for leg in sorted(glob.glob(os.path.join(HERE, "compare-*"))):
        doc = json.load(open(os.path.join(leg, "summary.json")))
        p = doc["runs"][backend]["phases"][phase]
        row.setdefault(leg[-1], []).append(f"{leg[-2:]}: {p['median_ms']:.1f} ({p['p10_ms']:.1f}-{p['p90_ms']:.1f})")
    print(f"| compare, {backend} {phase}, ms median (p10-p90) per run | {'; '.join(row['A'])} | {'; '.join(row['B'])} |")
runs = {"before": [], "after": []}
for f in sorted(glob.glob(os.path.join(HERE, "interleaved", "*.json"))):
    runs[os.path.basename(f).split("-")[1]].append(json.load(open(f))["phases"]["step"]["median_ms"])
cells = [f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f}, n={len(v)})" for v in runs.values()]
print(f"| interleaved harness.run, torch-compile step, ms: median of run medians (range, n) | {cells[0]} | {cells[1]} |")
