#!/bin/bash
# This branch against main on a host with N GPUs (N=${N:-2}): JAX's replicated step with the Pallas
# attention (--attention pallas), batch 4 per device, ${RUNS:-3} runs a side, into $OUT/pallas-n$N.tgz.
# main gathers q, k and v onto every device; this branch runs the kernels per device under
# shard_map. Needs nvtx importable and .ab-trees/<main's commit> (harness.ab --base main --unpack-only).
set -u
n=${N:-2}
out=${OUT:-/tmp/out}
python3 -m harness.ab --base "${BASE:?set BASE to the full commit of main}" --runs "${RUNS:-3}" --out "/tmp/ps/n$n" \
    --timeout 300 -- --backend jax --model large --ctx 1024 --dtype bf16 --attention pallas --device cuda \
    --batch 4 --data-parallel "$n" --parallel ddp --warmup 5 --steps 10
tar czf "$out/pallas-n$n.tgz" -C /tmp/ps "n$n"
