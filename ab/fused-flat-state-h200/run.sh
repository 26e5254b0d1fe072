#!/bin/bash
# The A/B of this branch against main on one GPU: batch 4 (three runs a side), then batch 48
# (two a side); `run.sh b4` or `run.sh b48` runs one of them, within one command's time limit.
# harness.ab keeps finished runs. The output is packed into one file ($OUT/fused-flat-<stage>.tgz).
# Needs .ab-trees/<main's commit> beside the tree (`python -m harness.ab --base main --unpack-only`).
# And the project's dependencies importable there, nvtx among them (its wheel, where pip has no index).
set -u
base=${BASE:?set BASE to the full commit harness.ab --unpack-only printed}
out=${OUT:-/tmp/out}
stage=${1:-all}
M="--backend jax --model large --ctx 1024 --dtype bf16 --attention fused --device cuda"
if [ "$stage" = b4 ] || [ "$stage" = all ]; then
    python3 -m harness.ab --base "$base" --runs 3 --out /tmp/fused-flat/b4 --timeout 200 \
        -- $M --batch 4 --warmup 5 --steps 10
fi
if [ "$stage" = b48 ] || [ "$stage" = all ]; then
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.94 python3 -m harness.ab --base "$base" --runs 2 \
        --out /tmp/fused-flat/b48 --timeout 300 -- $M --batch 48
fi
tar czf "$out/fused-flat-$stage.tgz" -C /tmp fused-flat
