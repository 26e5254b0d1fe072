#!/bin/bash
# torch-compile GEMM choices under BLAS settings, then one step run per Inductor option
set -u
pip install -q --no-index --no-deps --target /tmp/pydeps .gpu/wheels/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/pydeps:$PWD XFPROF_GIT_COMMIT=${COMMIT:?}
python3 -c "import torch, torch._inductor.config as c; print(torch.__version__, 'pdl', hasattr(c.triton,'enable_pdl'), 'mix', hasattr(c.triton,'mix_order_reduction') or hasattr(c,'mix_order_reduction'))"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader
mkdir -p $OUT
for round in 1 2; do
  for set in "" "TORCH_BLAS_PREFER_CUBLASLT=1" "TORCH_BLAS_PREFER_CUBLASLT=1 CUBLASLT_WORKSPACE_SIZE=131072" "NO_BF16_RR=1" "TORCHINDUCTOR_MIX_ORDER_REDUCTION=0" "TORCHINDUCTOR_ENABLE_PDL=1"; do
    s=$(date +%s)
    env $set timeout 150 python3 .gpu/gemmsel.py >> $OUT/gemmsel.jsonl 2> /tmp/gs.err || { echo "FAIL [$set]"; tail -5 /tmp/gs.err; }
    echo "round $round [$set] $(( $(date +%s) - s )) s"; tail -1 $OUT/gemmsel.jsonl | cut -c1-700
  done
done
