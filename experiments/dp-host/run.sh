#!/bin/bash
# Data-parallel experiments, large ctx 1024 bf16 fused attention, batch 4 per device, 2 GPUs.
# Usage: run_f.sh PART   (cells of that part; each cell one harness.run document)
set -u
part=$1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# (nvtx installed beforehand)
BASE=$PWD; XP=$PWD/experiments/dp-host:$BASE
W=$PWD/runs/f; mkdir -p $W; C=$PWD/runs/cachef; mkdir -p $C
M="--model large --ctx 1024 --dtype bf16 --attention fused --batch 4 --warmup 5 --steps 10 --quiet"
T0=$(date +%s)
(nvidia-smi -L; nvidia-smi topo -m; nproc; python3 -c "import torch,jax;print(torch.__version__,jax.__version__)") > $W/env-$part.txt 2>&1
cell() {  # name, env assignments..., then -- and harness.run arguments
  local name=$1; shift; local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  if [ $(( $(date +%s) - T0 )) -gt ${BUDGET:-520} ]; then echo "$name skipped (time)" | tee -a $W/cells.txt; return; fi
  local t0=$(date +%s)
  env PYTHONPATH=$BASE "${envs[@]}" timeout 240 python3 -m harness.run $M "$@" --compile-cache $C --out $W/$name.json > $W/$name.log 2>&1
  echo "$name rc=$? $(( $(date +%s) - t0 ))s" | tee -a $W/cells.txt
  tar czf runs/f.tgz -C $PWD/runs --exclude=cachef f
}
if [ $part = A ]; then
  cell torch-n1 -- --backend torch --data-parallel 1
  cell torch-n2 -- --backend torch --data-parallel 2
  cell torch-n2-bind PYTHONPATH=$XP XP_BIND=1 -- --backend torch --data-parallel 2
  cell tc-n1 -- --backend torch-compile --data-parallel 1
  cell tc-n2 -- --backend torch-compile --data-parallel 2
  cell tc-n2-b250 -- --backend torch-compile --data-parallel 2 --ddp-bucket-mb 250
fi
if [ $part = B ]; then
  cell tc-n1-regional PYTHONPATH=$XP XP_REGIONAL=1 -- --backend torch-compile --data-parallel 1
  cell tc-n2-regional PYTHONPATH=$XP XP_REGIONAL=1 XP_OPTIMIZE_DDP=0 -- --backend torch-compile --data-parallel 2
  cell jax-n1 -- --backend jax --data-parallel 1
  cell jax-n2 -- --backend jax --data-parallel 2
  cell jax-n2-lhs XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true -- --backend jax --data-parallel 2
  t0=$(date +%s); CUDA_VISIBLE_DEVICES=0,1 PYTHONPATH=$BASE timeout 150 python3 experiments/dp-host/jax_dispatch.py large $W/jax_dispatch.json > $W/jax_dispatch.log 2>&1
  echo "jax_dispatch rc=$? $(( $(date +%s) - t0 ))s" | tee -a $W/cells.txt
  tar czf runs/f.tgz -C $PWD/runs --exclude=cachef f
fi
if [ $part = C ]; then
  cell cg-n1 -- --backend torch-compile-cg --data-parallel 1
  cell cg-n2-b250 -- --backend torch-compile-cg --data-parallel 2 --ddp-bucket-mb 250
  t0=$(date +%s); CUDA_VISIBLE_DEVICES=0,1 PYTHONPATH=$BASE timeout 150 python3 experiments/dp-host/jax_dispatch.py large $W/jax_dispatch.json > $W/jax_dispatch.log 2>&1
  echo "jax_dispatch rc=$? $(( $(date +%s) - t0 ))s" | tee -a $W/cells.txt
  tar czf runs/f.tgz -C $PWD/runs --exclude=cachef f
fi
