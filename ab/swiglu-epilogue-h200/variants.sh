#!/bin/bash
# Each tile variant of the epilogue kernels in its own process.
# Writes JSON lines to $1 (default: variants.jsonl beside it).
here=$(dirname "$0")
out=${1:-$here/variants.jsonl}
while read -r kind tiles; do
  [ -z "$kind" ] && continue
  timeout 120 python3 "$here/variant.py" $kind $tiles >> "$out" 2>> "$out.err" \
    || echo "{\"kind\": \"$kind\", \"tiles\": \"$tiles\", \"error\": \"exit $?\"}" >> "$out"
done <<'LIST'
up 128 128 4 2 64 True True True
up 128 128 4 2 64 False True True
up 64 256 3 2 64 False False True
up 64 128 3 2 64 False False False
down 128 128 4 2 64 True True
LIST
