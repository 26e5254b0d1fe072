#!/bin/bash
# torch-compile's step, large ctx 1024 bf16 batch 32 on one GPU: Inductor's defaults (tc-N) against
# max-autotune with Hopper's persistent TMA GEMM templates (tcmax-N). Writes $OUT/runs.tgz.
pip install -q --no-index --no-deps --target /tmp/pydeps .gpu/wheels/*.whl >/dev/null 2>&1
mkdir -p $OUT/runs $OUT/logs
export PYTHONPATH=$PWD:/tmp/pydeps
for name in "$@"; do
  case $name in
  tcmax-*) env="TORCHINDUCTOR_MAX_AUTOTUNE=1 ENABLE_PERSISTENT_TMA_MATMUL=1"; limit=450;;
  tc-*) env=; limit=220;;
  esac
  start=$(date +%s)
  env $env timeout $limit python3 -m harness.run --backend torch-compile --model large --ctx 1024 --batch 32 --dtype bf16 \
     --attention fused --device cuda --out $OUT/runs/$name.json > $OUT/logs/$name.log 2>&1
  echo "$name rc=$? $(( $(date +%s) - start ))s $(grep -E '^(forward|backward|optimizer|step) |first step' $OUT/logs/$name.log | tr -s ' ' | cut -c1-60 | tr '\n' ';')"
done
tar -C $OUT -czf $OUT/runs.tgz runs logs && rm -rf $OUT/runs $OUT/logs
