#!/bin/bash
pip install -q --no-index --no-deps --target /tmp/pydeps .gpu/wheels/*.whl >/dev/null 2>&1
mkdir -p $OUT/runs $OUT/logs
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $OUT/logs/gpu.txt
(timeout 150 python3 .gpu/dispatch.py 1 327; NODONATE=1 timeout 120 python3 .gpu/dispatch.py 1 327; \
 XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 120 python3 .gpu/dispatch.py 1 327) > $OUT/logs/dispatch.txt 2>$OUT/logs/dispatch.err
cat $OUT/logs/dispatch.txt
start=$(date +%s)
PYTHONPATH=$PWD:/tmp/pydeps XLA_PYTHON_CLIENT_MEM_FRACTION=0.94 timeout 200 python3 -m harness.run --backend jax --model large \
  --ctx 1024 --batch 32 --dtype bf16 --attention fused --device cuda --out $OUT/runs/head-b32.json > $OUT/logs/head-b32.log 2>&1
echo "head-b32 rc=$? $(( $(date +%s) - start ))s"; grep -i "fused_step\|mfu" $OUT/logs/head-b32.log | head -5
