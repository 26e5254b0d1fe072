#!/bin/bash
# Data-parallel round 3: large ctx 1024 bf16 fused, batch 4/device, 2 GPUs.  Usage: run_g.sh PART
set -u
part=$1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
pip install -q --no-index --no-deps --target .gpu/site WHEELS 2>/dev/null
BASE=$PWD:$PWD/.gpu/site; XP=$PWD/experiments/dp-host:$BASE
W=$PWD/runs/g; mkdir -p $W; C=$PWD/runs/cacheg; mkdir -p $C
M="--model large --ctx 1024 --dtype bf16 --attention fused --batch 4 --warmup 5 --steps 10 --quiet"
T0=$(date +%s)
(nvidia-smi -L; nvidia-smi topo -m; nproc; git rev-parse HEAD; git status --short | head; python3 -c "import torch,jax;print(torch.__version__,jax.__version__)") > $W/env-$part.txt 2>&1
cell() {  # name, env assignments..., then -- and harness.run arguments
  local name=$1; shift; local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  if [ $(( $(date +%s) - T0 )) -gt ${BUDGET:-500} ]; then echo "$name skipped (time)" | tee -a $W/cells.txt; return; fi
  local t0=$(date +%s)
  env PYTHONPATH=$BASE "${envs[@]}" timeout 240 python3 -m harness.run $M "$@" --compile-cache $C --out $W/$name.json > $W/$name.log 2>&1
  echo "$name rc=$? $(( $(date +%s) - t0 ))s" | tee -a $W/cells.txt
  tar czf $OUT/g.tgz -C $PWD/runs --exclude=cacheg g
}
if [ $part = A ]; then
  cell jax-n1 -- --backend jax --data-parallel 1
  cell jax-n2 -- --backend jax --data-parallel 2
  cell torch-n1 -- --backend torch --data-parallel 1
  cell torch-n2-fsdp -- --backend torch --data-parallel 2 --parallel fsdp
  cell torch-n2-fsdp-keep -- --backend torch --data-parallel 2 --parallel fsdp --fsdp-reshard-after-forward false
  cell tc-n2-nosplit PYTHONPATH=$XP XP_OPTIMIZE_DDP=0 -- --backend torch-compile --data-parallel 2
  cell tc-n1 -- --backend torch-compile --data-parallel 1
fi
if [ $part = B ]; then
  cell tc-n2 -- --backend torch-compile --data-parallel 2
  cell tc-n2-fsdp -- --backend torch-compile --data-parallel 2 --parallel fsdp
  cell jax-n2-fsdp -- --backend jax --data-parallel 2 --parallel fsdp
  cell torch-n2 -- --backend torch --data-parallel 2
  cell cg-n1 -- --backend torch-compile-cg --data-parallel 1
  cell cg-n2 -- --backend torch-compile-cg --data-parallel 2
fi
if [ $part = C ]; then
  cell tc-n1-cpp TORCHINDUCTOR_CPP_WRAPPER=1 -- --backend torch-compile --data-parallel 1
  cell tc-n2-cpp TORCHINDUCTOR_CPP_WRAPPER=1 -- --backend torch-compile --data-parallel 2
  cell torch-n1-b -- --backend torch --data-parallel 1
  cell tc-n1-b -- --backend torch-compile --data-parallel 1
fi
