#!/bin/bash
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv
timeout 150 python3 ab/cublaslt-h200/xlagemm.py 2>&1 | grep -v Warning | cut -c1-1600 > $OUT/xlagemm.txt
timeout 150 python3 ab/cublaslt-h200/capgemm.py jax 2>&1 | grep -v Warning > $OUT/cap-jax.txt
timeout 260 python3 ab/cublaslt-h200/capgemm.py torch 2>&1 | grep -v Warning > $OUT/cap-torch.txt
tail -c 3000 $OUT/xlagemm.txt; tail -c 1500 $OUT/cap-jax.txt; tail -c 3000 $OUT/cap-torch.txt
