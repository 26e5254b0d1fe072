"""Speed-up per cell-pass in two target tables, side by side.

usage: python compare_targets.py A1.json A2.json ... -- B1.json B2.json ...
Each side is read like harness.attention_targets reads its files (a cell in
several: the last); prints a markdown table of each side's speed-up over the
fastest reference and whether each meets the target."""
import json, sys
from pathlib import Path
from harness.attention_targets import check_hopper, latest_cells

split = sys.argv.index("--")
sides = [sys.argv[1:split], sys.argv[split + 1:]]
records = []
for files in sides:
    rows = latest_cells([json.loads(Path(f).read_text())["results"] for f in files])
    records.append({(r["head_dim"], r["seq"], r["causal"], r["batch"], r["heads"], r["pass"]): r
                    for r in check_hopper(rows) if r["pass"] != "fwd_bwd"})
print("# Two target tables side by side\n")
print("Speed-up = time of the fastest reference / time of `pallas_mosaic`, per cell and pass (a cell in several "
      "files of a side: the last).\n")
for label, files in zip("AB", sides):
    print(f"- {label}: " + ", ".join(f"`{Path(f).name}`" for f in files))
print()
print("| D | seq | causal | B x H | pass | A | B | |")
print("|---|---|---|---|---|---|---|---|")
met = [0, 0]
for key in sorted(records[1]):
    d, seq, causal, batch, heads, name = key
    a, b = records[0].get(key), records[1][key]
    cells = []
    for i, rec in enumerate((a, b)):
        s = rec and rec["speedup"]
        met[i] += bool(s and s >= 1.0)
        cells.append("-" if not s else f"{s:.3f}x" + ("" if s >= 1.0 else " below"))
    change = "" if a is None or (a["speedup"] >= 1.0) == (b["speedup"] >= 1.0) else "flipped"
    print(f"| {d} | {seq} | {'yes' if causal else 'no'} | {batch} x {heads} | {name} | {cells[0]} | {cells[1]} | {change} |")
print(f"\nmeeting the target: A {met[0]}, B {met[1]} of {len(records[1])}")
