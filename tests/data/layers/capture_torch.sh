#!/usr/bin/env bash
# Capture the torch layer-attribution fixtures on a CUDA machine, from the repository root:
#
#     NSYS=/path/to/nsys bash tests/data/layers/capture_torch.sh [OUT_DIR]
#
# Two runs of `harness.run --layer-ranges` (tiny, ctx 64, bf16, 2 warm-up and 3 measured
# steps) under nsys: `torch_tiny_layers_plain` and `torch_tiny_layers_planted`, whose block 1
# has an FFN 16 times wider (--wide-layer 1 --wide-factor 16). Each keeps its harness JSON
# and its SQLite export, slimmed (tables the reader does not use dropped) and gzipped.
set -euo pipefail
OUT=${1:-tests/data/layers}
NSYS=${NSYS:-nsys}
mkdir -p "$OUT"
for name in plain planted; do
    extra=()
    if [ "$name" = planted ]; then extra=(--wide-layer 1 --wide-factor 16); fi
    stem="$OUT/torch_tiny_layers_$name"
    "$NSYS" profile -o "$stem" --force-overwrite true --trace=cuda,nvtx --sample=none --cpuctxsw=none \
        --cuda-graph-trace=node \
        python -m harness.run --backend torch --model tiny --ctx 64 --steps 3 --warmup 2 --dtype bf16 \
        --device cuda --layer-ranges --quiet "${extra[@]}" --out "$stem.harness.json"
    "$NSYS" export --type sqlite --force-overwrite true -o "$stem.sqlite" "$stem.nsys-rep"
    python -c "import sys; sys.path.insert(0, 'tests/data'); from pathlib import Path; \
from capture_fixtures import slim; slim(Path('$stem.sqlite'))"
    gzip -9 -f "$stem.sqlite"
    rm -f "$stem.nsys-rep"
    ls -l "$stem.sqlite.gz" "$stem.harness.json"
done
