#!/bin/bash
# cuBLAS for every JAX matmul (XLA_FLAGS=--xla_gpu_enable_triton_gemm=false) against XLA's
# defaults, main's tree, on one GPU; each stage fits one 10-minute command:
#   bash run.sh b4    batch 4, three runs a side
#   bash run.sh b48   batch 48, two runs a side (about 105 s a run)
# Needs nvtx importable. LIMIT (seconds) bounds each stage; what finished is packed into $OUT.
set -u
out=${OUT:-/tmp/out}
lim=${LIMIT:-540}
mkdir -p "$out" /tmp/cg
M="--backend jax --model large --ctx 1024 --dtype bf16 --attention fused --device cuda"
case "${1:?b4 or b48}" in
b4) timeout "$lim" python3 -m harness.ab --env-b XLA_FLAGS=--xla_gpu_enable_triton_gemm=false --runs 3 \
        --out /tmp/cg/b4 --timeout 150 -- $M --batch 4 --warmup 5 --steps 10 ;;
b48) timeout "$lim" python3 -m harness.ab --env-b XLA_FLAGS=--xla_gpu_enable_triton_gemm=false --runs 2 \
        --out /tmp/cg/b48 --timeout 170 -- $M --batch 48 --allow-oom ;;
esac
tar czf "$out/$1.tgz" -C /tmp/cg "$1"
