#!/bin/bash
# JAX's fused step with cuDNN's flash attention (fused) against the Hopper Pallas kernel (pallas),
# large ctx 1024 bf16 on one GPU; names: fused-N, pallas-N (batch 32), fused48-N, pallas48-N (batch 48),
# parity. Writes $OUT/runs.tgz.
pip install -q --no-index --no-deps --target /tmp/pydeps .gpu/wheels/*.whl >/dev/null 2>&1
mkdir -p $OUT/runs $OUT/logs
export PYTHONPATH=$PWD:/tmp/pydeps XLA_PYTHON_CLIENT_MEM_FRACTION=0.94
for name in "$@"; do
  case $name in
  parity)
    timeout 200 python3 -m harness.parity --model small --ctx 1024 --batch 4 --dtype bf16 \
      --attention pallas --device cuda --backend jax > $OUT/logs/parity.log 2>&1
    echo "parity rc=$?"; tail -5 $OUT/logs/parity.log; continue;;
  fused48-*) att=fused; batch=48;;
  pallas48-*) att=pallas; batch=48;;
  fused-*) att=fused; batch=32;;
  pallas-*) att=pallas; batch=32;;
  esac
  timeout 220 python3 -m harness.run --backend jax --model large --ctx 1024 --batch $batch --dtype bf16 \
     --attention $att --device cuda --out $OUT/runs/$name.json > $OUT/logs/$name.log 2>&1
  echo "$name rc=$? $(grep -E '^(forward|backward|step|fused_step) ' $OUT/logs/$name.log | tr -s ' ' | cut -c1-60 | tr '\n' ';')"
done
tar -C $OUT -czf $OUT/runs.tgz runs logs && rm -rf $OUT/runs $OUT/logs
