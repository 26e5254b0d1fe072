"""Render each round's table from its ab.json: python ab/step-variants-h200/table.py."""
import json
import pathlib

here = pathlib.Path(__file__).parent
for doc_path in sorted(here.glob("round*/ab.json")):
    doc = json.loads(doc_path.read_text())
    print(f"### {doc_path.parent.name}: {doc['device']}, jax {doc['jax']}, batch {doc['batch']}, "
          f"{len(doc['rounds'])} interleaved rounds\n")
    print("| variant | fused step ms (median, range over rounds) | / base in the same round (median, range) "
          "| XLA temp GB | kernel ms per profiled step |")
    print("|---|---|---|---|---|")
    for v, s in doc["summary"].items():
        mem = doc["memory"].get(v, {}).get("temp")
        kern = sum(x[0] for x in doc["kernels"].get(v, {}).values()) / 1e6
        print(f"| {v} | {s['median_ms']:.1f} ({s['min']:.1f}-{s['max']:.1f}) | {s['ratio_median']:.3f} "
              f"({s['ratio_min']:.3f}-{s['ratio_max']:.3f}) | {mem / 1e9:.1f} | {kern:.1f} |")
    print()
