#!/bin/bash
# This branch against main on a host with N GPUs (N=${N:-2}): JAX's replicated fused step at the
# weak-scaling batch (4 per device), ${RUNS:-3} runs a side, into $OUT/ddp-flat-n$N.tgz; then, with
# PROFILE=1, this branch's step under Nsight Systems, for harness.diff against main's profile in
# results/several-gpus/second-device-ddp2-h200x2/. Needs nvtx importable and .ab-trees/<main's commit>
# (harness.ab --base main --unpack-only).
set -u
n=${N:-2}
out=${OUT:-/tmp/out}
python3 -m harness.ab --base "${BASE:?set BASE to the full commit of main}" --runs "${RUNS:-3}" --out "/tmp/dfa/n$n" \
    --timeout 300 -- --backend jax --model large --ctx 1024 --dtype bf16 --attention fused --device cuda \
    --batch 4 --data-parallel "$n" --parallel ddp --warmup 5 --steps 10
if [ "${PROFILE:-0}" = 1 ]; then
    python3 -m harness.compare --model large --ctx 1024 --dtype bf16 --attention fused --backend jax \
        --data-parallel "$n" --nsys --no-parity --warmup 3 --steps 6 --out "/tmp/dfa/n$n/profiled"
    rm -f /tmp/dfa/n"$n"/profiled/*/*.nsys-rep
fi
tar czf "$out/ddp-flat-n$n.tgz" -C /tmp/dfa "n$n"
