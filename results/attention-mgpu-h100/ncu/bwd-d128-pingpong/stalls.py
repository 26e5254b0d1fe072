"""Summarize an Nsight Compute source page (--page source --csv --print-source sass):
per kernel, the stall reasons and opcodes over all warp samples, and the hottest
instructions. usage: python stalls.py two128-source.csv"""
import collections
import csv
import re
import sys

kernels, header, kernel = collections.defaultdict(list), None, None
for row in csv.reader(open(sys.argv[1])):
    if not row:
        continue
    if row[0] == "Kernel Name":
        kernel = row[1]
    elif row[0] == "Address":
        header = row
    elif kernel and header and row[0].startswith("0x"):
        kernels[kernel].append(dict(zip(header, row)))
for kernel, rows in kernels.items():
    samples = lambda r: int(r["Warp Stall Sampling (All Samples)"])
    total = sum(map(samples, rows))
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    by_reason = {h: sum(int(r[h] or 0) for r in rows) for h in reasons}
    by_opcode = collections.Counter()
    for r in rows:
        m = re.match(r"\s*(@!?U?P\w+\s+)?([A-Z0-9_]+)", r["Source"])
        by_opcode[m.group(2) if m else "?"] += samples(r)
    print(f"## {kernel}\n\n{len(rows)} instructions, {total} warp samples (all warps: the producer's too)\n")
    print("- stall reasons: " + ", ".join(f"{h[6:]} {v / total:.1%}"
                                          for h, v in sorted(by_reason.items(), key=lambda x: -x[1])[:8]))
    print("- opcodes: " + ", ".join(f"{o} {v / total:.1%}" for o, v in by_opcode.most_common(10)))
    print("\n| share | main reason | executed | instruction |\n|---|---|---|---|")
    for r in sorted(rows, key=samples, reverse=True)[:12]:
        main = max(reasons, key=lambda h: int(r[h] or 0))
        print(f"| {samples(r) / total:.1%} | {main[6:]} | {r['Instructions Executed']} | `{r['Source'].strip()}` |")
    print()
