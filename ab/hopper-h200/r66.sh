#!/bin/bash
# Issue 61 on one H200: forward key blocks of 176/192 rows (FA3's non-causal tiles), one q buffer, 240 registers.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD XFPROF_GIT_COMMIT=$1
W=$OUT/r66; mkdir -p $W
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee $W/gpu.txt
PASS=fwd ITERS=11 timeout -s INT 330 python3 .gpu/vab.py 'single:_Q_SINGLE=True;k192:_BLOCK_K_FWD=192,_Q_SINGLE=True,_REGS=240;k192n:_BLOCK_K_FWD=192,_Q_SINGLE=True;r240:_REGS=240' 1:16:16384:128:n 4:16:4096:128:n 2>&1 | grep -v -i "warn\|constant fold\|transpose.1\|necessarily a bug\|file a bug\|operation took\|^$" | tee $W/ab-fwd128.log
PASS=fwd ITERS=11 timeout -s INT 200 python3 .gpu/vab.py 'single:_Q_SINGLE=True;k192:_BLOCK_K_FWD=192,_Q_SINGLE=True' 1:32:16384:64:n 2>&1 | grep -v -i "warn\|constant fold\|transpose.1\|necessarily a bug\|file a bug\|operation took\|^$" | tee $W/ab-fwd64.log
