#!/bin/bash
# This branch against main: JAX's replicated fused step at batch 4 per device on N GPUs
# (N=${N:-4}), ${RUNS:-3} runs a side, packed into $OUT/flat-ddp-n$N.tgz. Needs nvtx importable and
# .ab-trees/<main's commit> (harness.ab --base main --unpack-only, where git has the history).
set -u
n=${N:-4}
out=${OUT:-/tmp/out}
python3 -m harness.ab --base "${BASE:?set BASE to the full commit of main}" --runs "${RUNS:-3}" --out "/tmp/fd/n$n" \
    --timeout 240 -- --backend jax --model large --ctx 1024 --dtype bf16 --attention fused --device cuda \
    --batch 4 --data-parallel "$n" --parallel ddp --warmup 5 --steps 10
tar czf "$out/flat-ddp-n$n.tgz" -C /tmp/fd "n$n"
