#!/bin/bash
# The A/B of this branch against main on one GPU: batch 4 (three runs a side), then batch 48
# (two a side). harness.ab keeps finished runs, so after a command's time limit the same
# command goes on. The output is packed into one file ($OUT/fused-flat.tgz).
# Needs .ab-trees/<main's commit> beside the tree (`python -m harness.ab --base main --unpack-only`).
# And the project's dependencies importable there, nvtx among them (its wheel, where pip has no index).
set -u
base=${BASE:?set BASE to the full commit harness.ab --unpack-only printed}
out=${OUT:-/tmp/out}
M="--backend jax --model large --ctx 1024 --dtype bf16 --attention fused --device cuda"
python3 -m harness.ab --base "$base" --runs 3 --out /tmp/fused-flat/b4 --timeout 200 -- $M --batch 4 --warmup 5 --steps 10
XLA_PYTHON_CLIENT_MEM_FRACTION=0.94 python3 -m harness.ab --base "$base" --runs 2 --out /tmp/fused-flat/b48 \
    --timeout 300 -- $M --batch 48
tar czf "$out/fused-flat.tgz" -C /tmp fused-flat
