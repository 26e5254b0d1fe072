#!/bin/bash
# The step A/B this branch waits for, on one H200 (or H100): JAX's fused step, large ctx 1024 bf16
# batch 32, runs interleaved:
#   old-N  main (A), unpacked in .gpu/old
#   new-N  this branch (B): the model's SwiGLU on the epilogue kernels
#   check  the kernels alone (check.py)
# From the repository root, with main's tree in .gpu/old
# (git archive main harness jax_impl torch_impl pallas_kernels pyproject.toml | tar -x -C .gpu/old)
# and the nvtx wheel in .gpu/wheels; each command runs less than 10 minutes, so the list is
# split across commands: step.sh check old-1 new-1, then step.sh new-2 old-2 ... Writes $OUT/runs.tgz.
pip install -q --no-index --no-deps --target /tmp/pydeps .gpu/wheels/*.whl >/dev/null 2>&1
mkdir -p $OUT/runs $OUT/logs
ROOT=$PWD
OLD=${OLD_COMMIT:?set OLD_COMMIT to the commit of main}
for name in "$@"; do
  case $name in
  check)
    PYTHONPATH=$ROOT:/tmp/pydeps timeout 300 python3 ab/swiglu-epilogue-h200/check.py > $OUT/logs/check.log 2>&1
    echo "check rc=$?"; grep '^{' $OUT/logs/check.log; continue;;
  old-*) dir=$ROOT/.gpu/old; commit=$OLD;;
  *) dir=$ROOT; commit=;;
  esac
  (cd $dir && XFPROF_GIT_COMMIT=$commit PYTHONPATH=$dir:/tmp/pydeps XLA_PYTHON_CLIENT_MEM_FRACTION=0.94 \
     timeout 200 python3 -m harness.run --backend jax --model large --ctx 1024 --batch 32 --dtype bf16 \
     --attention fused --device cuda --out $OUT/runs/$name.json > $OUT/logs/$name.log 2>&1)
  echo "$name rc=$? $(grep -E '^(forward|backward|step|fused_step) ' $OUT/logs/$name.log | tr -s ' ' | cut -c1-60 | tr '\n' ';')"
done
tar -C $OUT -czf $OUT/runs.tgz runs logs && rm -rf $OUT/runs $OUT/logs
