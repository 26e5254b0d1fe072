#!/usr/bin/env bash
# Capture the JAX layer-attribution fixture on a CUDA machine, from the repository root:
#
#     NSYS=/path/to/nsys tests/data/layers/capture_jax.sh [more harness.run options]
#
# Runs `harness.run --backend jax --layer-ranges` (tiny model, ctx 64, bf16) under nsys with
# the flags the harness itself uses (harness.trace.sources.nsys.TRACE_FLAGS + the jax record's nsys_flags, XLA's TSL
# NVTX domain excluded), and keeps, in this folder: the gzipped and slimmed SQLite export
# (jax_layers.sqlite.gz), the result JSON (jax_layers.harness.json) and the optimized HLO the
# run wrote (jax_layers.hlo/forward.txt, backward.txt). Extra arguments go to harness.run:
# pass the option that plants a wider block there, so tests/test_layers_jax_fixture.py can
# check that the join finds it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
nsys=${NSYS:-nsys}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
name=jax_layers

"$nsys" profile --trace=cuda,nvtx --sample=none --cpuctxsw=none --cuda-graph-trace=node \
    --nvtx-domain-exclude=TSL --force-overwrite=true --output="$work/$name" \
    python -m harness.run --backend jax --model tiny --ctx 64 --steps 3 --warmup 2 --dtype bf16 \
    --device cuda --layer-ranges --quiet --out "$work/$name.harness.json" "$@"
"$nsys" export --type sqlite --force-overwrite true --output "$work/$name.sqlite" "$work/$name.nsys-rep"
python -c "import sys; sys.path.insert(0, 'tests/data'); from capture_fixtures import slim; slim(sys.argv[1])" \
    "$work/$name.sqlite"

gzip -9 -c "$work/$name.sqlite" > "$here/$name.sqlite.gz"
cp "$work/$name.harness.json" "$here/"
mkdir -p "$here/$name.hlo"
sed "s#$PWD/##g" "$work/$name.hlo/forward.txt" > "$here/$name.hlo/forward.txt"
sed "s#$PWD/##g" "$work/$name.hlo/backward.txt" > "$here/$name.hlo/backward.txt"
for f in "$here/$name.sqlite.gz" "$here/$name.harness.json" "$here/$name.hlo"/*.txt; do
    size=$(stat -c %s "$f")
    if [ "$size" -gt 2000000 ]; then
        echo "capture_jax.sh: $f is $size bytes, over the 2 MB a fixture may take; use fewer steps" >&2
        exit 1
    fi
done
ls -l "$here" "$here/$name.hlo"
