"""Per-pass speed-up of pallas_mosaic against the fastest reference, from the
per-implementation lines a bench_attention run prints (for a run stopped
before it wrote its JSON). usage: python log_ratios.py RUN.log"""
import collections, re, sys

cells = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    m = re.match(r"(\S+)\s+b=(\d+)\s+h=(\d+)\s+s=(\d+)\s+d=(\d+)\s+\S+\s+causal=(\S+)\s+fwd=([\d.]+)ms bwd=([\d.]+)ms "
                 r"fwd_bwd=([\d.]+)ms", line)
    if m:
        cells[m.group(2, 3, 4, 5, 6)][m.group(1)] = tuple(map(float, m.group(7, 8, 9)))
for cell, times in cells.items():
    refs = {k: v for k, v in times.items() if k != "pallas_mosaic"}
    if "pallas_mosaic" not in times or not refs:
        continue
    ours = times["pallas_mosaic"]
    ratios = [min(v[i] for v in refs.values()) / ours[i] for i in range(3)]
    print("B={} H={} seq={} D={} causal={}: ".format(*cell)
          + " ".join(f"{p} {r:.3f}x" for p, r in zip(("fwd", "bwd", "fwd+bwd"), ratios))
          + f" (references: {', '.join(refs)})")
