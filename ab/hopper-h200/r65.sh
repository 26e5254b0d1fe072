#!/bin/bash
# Issue 61 on one H200: leaderboard baseline against cuDNN, the read-only final wait A/B, and the backward's kernels under nsys.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD XFPROF_GIT_COMMIT=$1
export LD_LIBRARY_PATH=$PWD/.gpu/nsyslib:$LD_LIBRARY_PATH
NSYS=/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys
W=$OUT/r65; mkdir -p $W
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee $W/gpu.txt
PASS=bwd timeout -s INT 300 python3 .gpu/vab.py 'ro:_WAIT_READ_ONLY=True' 16:1:16384:64:c 4:32:4096:64:n 4:16:4096:128:n 1:16:16384:128:c 2>&1 | grep -v -i warn | tee $W/ab-ro.log
timeout -s INT 150 python3 -m harness.bench_attention --shapes leaderboard --dtype bf16 --impl pallas_mosaic,jax_cudnn,torch_sdpa_cudnn --warmup 2 --out $W --name leaderboard-bf16 2>&1 | tail -5
timeout 120 $NSYS profile --trace=cuda --sample=none --cpuctxsw=none -o $W/lb python3 -m harness.attention_once --kernel mosaic --batch 16 --seq 16384 --heads 1 --head-dim 64 --causal true --repeat 5 > $W/nsys.log 2>&1
timeout 60 $NSYS stats --report cuda_gpu_kern_sum --format csv $W/lb.nsys-rep 2>/dev/null | head -20 > $W/kern.csv; cat $W/kern.csv | cut -c1-220
rm -f $W/lb.nsys-rep $W/lb.sqlite
