#!/bin/bash
# lt_mm checked at the step's GEMMs, then torch-compile at batch 32: this tree against 8ffb70b, three runs a side (resumable)
set -u
pip install -q --no-index --no-deps --target /tmp/pydeps .gpu/wheels/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/pydeps:$PWD XFPROF_GIT_COMMIT=${COMMIT:?}
mkdir -p $OUT .gpu/ab-lt
if [ ! -f .gpu/ab-lt/checked ]; then
  s=$(date +%s)
  timeout 170 python3 .gpu/ltcheck.py > $OUT/ltcheck.jsonl 2> /tmp/lc.err; echo "check rc=$? $(( $(date +%s) - s )) s"
  tail -4 /tmp/lc.err | cut -c1-400; cut -c1-300 $OUT/ltcheck.jsonl
  grep -q "CHECK ok" $OUT/ltcheck.jsonl || exit 1
  cp $OUT/ltcheck.jsonl .gpu/ab-lt/; touch .gpu/ab-lt/checked
fi
timeout ${LIMIT:-400} python3 -m harness.ab --base 8ffb70b8ae9678c0d732b3b7097903d5a9b63e31 --runs 3 --out .gpu/ab-lt -- \
  --backend torch-compile --model large --ctx 1024 --batch 32 --dtype bf16 --attention fused --device cuda > /tmp/ab.log 2>&1
echo "ab rc=$?"; tail -5 /tmp/ab.log | cut -c1-300
ls .gpu/ab-lt/runs 2>/dev/null; for f in .gpu/ab-lt/runs/*.json; do python3 -c "
import json;d=json.load(open('$f'));p=d['phases'];print('$f', {k:round(v.get('median_ms',0),1) for k,v in p.items() if isinstance(v,dict)})" 2>&1 | cut -c1-300; done
tar czf $OUT/ab-lt.tgz -C .gpu ab-lt
