#!/bin/bash
# The A/B this branch waits for, on one H200: main (A) against this branch (B), JAX's fused
# step at batch 32, three runs a side interleaved, then the kernel alone under a few block
# sizes against XLA (blocks.py), then parity with the kernel on the GPU.
# From the repository root, with main's tree unpacked in .gpu/old
# (git archive main harness jax_impl torch_impl pallas_kernels pyproject.toml | tar -x -C .gpu/old)
# and the nvtx wheel in .gpu/wheels. Writes $OUT/runs.tgz. About 10 minutes: split the list
# across two commands where one command may run less.
pip install -q --no-index --no-deps --target /tmp/pydeps .gpu/wheels/*.whl >/dev/null 2>&1
mkdir -p $OUT/runs $OUT/logs
ROOT=$PWD
OLD=${OLD_COMMIT:?set OLD_COMMIT to the commit of main}
for name in ${@:-old-1 new-1 new-2 old-2 new-3 old-3}; do
  if [ ${name%-*} = old ]; then dir=$ROOT/.gpu/old; commit=$OLD; else dir=$ROOT; commit=; fi
  (cd $dir && XFPROF_GIT_COMMIT=$commit PYTHONPATH=$dir:/tmp/pydeps XLA_PYTHON_CLIENT_MEM_FRACTION=0.94 timeout 160 \
     python3 -m harness.run --backend jax --model large --ctx 1024 --batch 32 --dtype bf16 --attention fused \
     --device cuda --out $OUT/runs/$name.json > $OUT/logs/$name.log 2>&1)
  echo "$name rc=$? $(grep -E '^(forward|backward|step|fused_step) ' $OUT/logs/$name.log | tr -s ' ' | cut -c1-40 | tr '\n' ';')"
done
PYTHONPATH=$ROOT:/tmp/pydeps timeout 120 python3 ab/swiglu-stacked-h200/blocks.py > $OUT/logs/blocks.jsonl 2>&1
echo "blocks rc=$?"; cat $OUT/logs/blocks.jsonl
PYTHONPATH=$ROOT:/tmp/pydeps timeout 200 python3 -m harness.parity --model small --ctx 256 --batch 4 --dtype bf16 \
  --attention fused --device cuda --backend jax > $OUT/logs/parity.log 2>&1; echo "parity rc=$?"; tail -3 $OUT/logs/parity.log
tar -C $OUT -czf $OUT/runs.tgz runs logs && rm -rf $OUT/runs $OUT/logs
