#!/bin/bash
# Two changes for JAX's step at small batches, on one GPU; each stage fits one 10-minute command:
#   bash run.sh norm     the norm backward's row groups alone (normbench.py), b4 and b32
#   bash run.sh ab       this branch's tree (min_programs_bwd) against main at batch 4, 3 runs a side
#   bash run.sh merger   XLA's dot merger off (--xla_gpu_dot_merger_threshold_mb=0) against on,
#                        this tree, batch 4, 3 runs a side (harness.ab --env-b)
#   bash run.sh profile  this tree at batch 4 under jax.profiler with --layer-ranges: the report
#                        joins each kernel to its layer and op through the optimized HLO
#                        (PROFILE_FLAGS, if set, becomes XLA_FLAGS for that run)
# Needs nvtx importable and, for `ab`, .ab-trees/<main's commit> (harness.ab --unpack-only).
# LIMIT (seconds) bounds each stage; what finished is packed into $OUT either way.
set -u
out=${OUT:-/tmp/out}
lim=${LIMIT:-540}
mkdir -p "$out" /tmp/sb
M="--backend jax --model large --ctx 1024 --dtype bf16 --attention fused --device cuda --batch 4 --warmup 5 --steps 10"
case "${1:?norm, ab, merger or profile}" in
norm) PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" timeout "$lim" python3 ab/small-batch-h200/normbench.py ;;
ab) timeout "$lim" python3 -m harness.ab --base "${BASE:?set BASE to the full commit of main}" --runs 3 \
        --out /tmp/sb/ab --timeout 150 -- $M
    tar czf "$out/ab.tgz" -C /tmp/sb ab ;;
merger) timeout "$lim" python3 -m harness.ab --env-b XLA_FLAGS=--xla_gpu_dot_merger_threshold_mb=0 --runs 3 \
        --out /tmp/sb/merger --timeout 150 -- $M
    tar czf "$out/merger.tgz" -C /tmp/sb merger ;;
profile) mkdir -p /tmp/sb/prof
    ( [ -n "${PROFILE_FLAGS:-}" ] && export XLA_FLAGS="$PROFILE_FLAGS"
      timeout "$lim" python3 -m harness.run $M --layer-ranges --framework-profile /tmp/sb/prof/trace \
        --out /tmp/sb/prof/run.json )
    timeout 120 python3 -m harness.report /tmp/sb/prof/trace/plugins/profile/*/*.xplane.pb \
        --harness-json /tmp/sb/prof/run.json --out /tmp/sb/prof/report --no-plot | tail -5
    tar czf "$out/prof.tgz" -C /tmp/sb prof ;;
esac
