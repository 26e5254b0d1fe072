#!/bin/bash
# The A/B this branch waits for, on one H200, JAX's fused step at batch 32, runs interleaved:
#   old-N  main (A), unpacked in .gpu/old
#   new-N  this branch (B)
#   cb-N   main with XLA's CUDA graphs off (XLA_FLAGS=--xla_gpu_enable_command_buffer=)
#   blocks the gate's backward alone under a few block sizes against XLA (blocks.py)
#   parity the JAX model with the kernel on the GPU
# From the repository root, with main's tree in .gpu/old
# (git archive main harness jax_impl torch_impl pallas_kernels pyproject.toml | tar -x -C .gpu/old)
# and the nvtx wheel in .gpu/wheels; each command runs less than 10 minutes, so the list is
# split across commands: run.sh old-1 new-1 cb-1 new-2. Writes $OUT/runs.tgz.
pip install -q --no-index --no-deps --target /tmp/pydeps .gpu/wheels/*.whl >/dev/null 2>&1
mkdir -p $OUT/runs $OUT/logs
ROOT=$PWD
OLD=${OLD_COMMIT:?set OLD_COMMIT to the commit of main}
for name in "$@"; do
  case $name in
  blocks)
    PYTHONPATH=$ROOT:/tmp/pydeps timeout 120 python3 ab/swiglu-stacked-h200/blocks.py > $OUT/logs/blocks.jsonl 2>&1
    echo "blocks rc=$?"; cat $OUT/logs/blocks.jsonl; continue;;
  parity)
    PYTHONPATH=$ROOT:/tmp/pydeps timeout 200 python3 -m harness.parity --model small --ctx 256 --batch 4 --dtype bf16 \
      --attention fused --device cuda --backend jax > $OUT/logs/parity.log 2>&1
    echo "parity rc=$?"; tail -3 $OUT/logs/parity.log; continue;;
  old-*) dir=$ROOT/.gpu/old; commit=$OLD; flags=;;
  cb-*) dir=$ROOT/.gpu/old; commit=$OLD; flags=--xla_gpu_enable_command_buffer=;;
  *) dir=$ROOT; commit=; flags=;;
  esac
  (cd $dir && XLA_FLAGS=$flags XFPROF_GIT_COMMIT=$commit PYTHONPATH=$dir:/tmp/pydeps XLA_PYTHON_CLIENT_MEM_FRACTION=0.94 \
     timeout 160 python3 -m harness.run --backend jax --model large --ctx 1024 --batch 32 --dtype bf16 \
     --attention fused --device cuda --out $OUT/runs/$name.json > $OUT/logs/$name.log 2>&1)
  echo "$name rc=$? $(grep -E '^(forward|backward|step|fused_step) ' $OUT/logs/$name.log | tr -s ' ' | cut -c1-40 | tr '\n' ';')"
done
tar -C $OUT -czf $OUT/runs.tgz runs logs && rm -rf $OUT/runs $OUT/logs
