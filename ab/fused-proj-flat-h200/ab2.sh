#!/bin/bash
# usage: ab2.sh NAME... (old-1 mid-1 new-1 ...): one harness.run per name; BATCH, EXTRA from env
pip install -q --no-index --no-deps --target /tmp/pydeps .gpu/wheels/*.whl >/dev/null 2>&1
mkdir -p $OUT/runs $OUT/logs
ROOT=$PWD
for name in "$@"; do
  side=${name%-*}
  case $side in
    old) dir=$ROOT/.gpu/old; commit=82e96bd20b9137f056df3546ec8b98eac2450390;;
    flat) dir=$ROOT/.gpu/flat; commit=;;
    mid) dir=$ROOT/.gpu/mid; commit=7872cee68053ea016c5f7c688d07cf65b6f09e1f;;
    *) dir=$ROOT; commit=;;
  esac
  start=$(date +%s)
  (cd $dir && XFPROF_GIT_COMMIT=$commit PYTHONPATH=$dir:/tmp/pydeps XLA_PYTHON_CLIENT_MEM_FRACTION=0.94 timeout ${TMO:-160} \
     python3 -m harness.run --backend jax --model large --ctx 1024 --batch ${BATCH:-32} --dtype bf16 --attention fused \
     --device cuda ${EXTRA:-} --out $OUT/runs/$name.json > $OUT/logs/$name.log 2>&1)
  echo "$name rc=$? $(( $(date +%s) - start ))s $(grep -E '^(forward|backward|optimizer|step|fused_step) ' $OUT/logs/$name.log | tr -s ' ' | cut -c1-48 | tr '\n' ';')"
done
tar -C $OUT -czf $OUT/runs.tgz runs logs && rm -rf $OUT/runs $OUT/logs
