#!/bin/bash
# Issue 61 on one H200: head_dim 64 forward with two overlapping consumers; leaderboard backward variants.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD XFPROF_GIT_COMMIT=$1
W=$OUT/r67; mkdir -p $W
F='warn\|constant fold\|transpose.1\|necessarily a bug\|file a bug\|operation took\|^$'
PASS=fwd ITERS=11 timeout -s INT 300 python3 .gpu/vab.py 'c2t:consumers=2;c2o:consumers=2,overlap=True;c2os:consumers=2,overlap=True,fwd_stagger=True' 1:32:16384:64:n 1:32:16384:64:c 4:32:4096:64:n 16:1:16384:64:c 2>&1 | grep -v -i "$F" | tee $W/ab-fwd64.log
PASS=bwd ITERS=11 timeout -s INT 200 python3 .gpu/vab.py 'bq128:block_q_dkv=128;two:fused_bwd=False,block_q_dkv=128' 16:1:16384:64:c 2>&1 | grep -v -i "$F" | tee $W/ab-bwd64.log
