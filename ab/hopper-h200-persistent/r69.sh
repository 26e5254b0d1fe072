#!/bin/bash
# Issue 61 on one H200: the persistent backward (_PERSISTENT_BWD) against the per-tile grid.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD XFPROF_GIT_COMMIT=$1
W=$OUT/r69; mkdir -p $W
F='warn\|constant fold\|transpose.1\|necessarily a bug\|file a bug\|operation took\|^$'
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee $W/gpu.txt
PASS=bwd ITERS=9 timeout -k 10 -s INT 230 python3 .gpu/vab.py 'pers:_PERSISTENT_BWD=True' 16:1:16384:64:c 4:32:4096:64:n 16:32:1024:64:n 16:16:1024:128:c 2>&1 | grep -v -i "$F" | tee $W/ab-persistent.log
