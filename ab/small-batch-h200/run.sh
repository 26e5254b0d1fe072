#!/bin/bash
# Two changes for JAX's step at small batches, on one GPU; each stage fits one 10-minute command:
#   bash run.sh norm     the norm backward's row groups alone (normbench.py), b4 and b32
#   bash run.sh ab       this branch's tree (min_programs_bwd) against main at batch 4, 3 runs a side
#   bash run.sh merger   XLA's dot merger off (--xla_gpu_dot_merger_threshold_mb=0) against on,
#                        this tree, batch 4, 3 runs a side, interleaved A B B A A B
# Needs nvtx importable and, for `ab`, .ab-trees/<main's commit> (harness.ab --unpack-only).
set -u
out=${OUT:-/tmp/out}
M="--backend jax --model large --ctx 1024 --dtype bf16 --attention fused --device cuda --batch 4 --warmup 5 --steps 10"
case "${1:?norm, ab or merger}" in
norm) python3 ab/small-batch-h200/normbench.py ;;
ab) python3 -m harness.ab --base "${BASE:?set BASE to the full commit of main}" --runs 3 --out /tmp/sb/ab --timeout 150 -- $M
    tar czf "$out/ab.tgz" -C /tmp/sb ab ;;
merger)
    mkdir -p /tmp/sb/merger/runs
    for run in a-1 b-1 b-2 a-2 a-3 b-3; do
        [ -e "/tmp/sb/merger/runs/$run.json" ] && continue
        if [ "${run%-*}" = b ]; then flags=--xla_gpu_dot_merger_threshold_mb=0; else flags=; fi
        XLA_FLAGS=$flags timeout 150 python3 -m harness.run $M --quiet --out "/tmp/sb/merger/runs/$run.json"
    done
    r=/tmp/sb/merger/runs
    python3 -m harness.diff $r/a-1.json,$r/a-2.json,$r/a-3.json $r/b-1.json,$r/b-2.json,$r/b-3.json \
        --out /tmp/sb/merger 2>&1 | tail -3
    tar czf "$out/merger.tgz" -C /tmp/sb merger ;;
esac
