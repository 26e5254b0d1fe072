"""One DDP step on 2 GPUs against one device on the global batch, per compiled backend and bucket size (experiment)."""
import dataclasses
import json
import sys

import numpy as np

from harness.timing.distributed import parity_step
from harness.timing.spec import RunSpec
from tests.test_data_parallel import _assert_parity, _one_device_step

out = {}
for backend, mb in [("torch-compile-cg", 250), ("torch-compile-cg", 1), ("torch-compile", 1)]:
    opts = RunSpec(backend=backend, model="tiny", ctx=16, batch=2, data_parallel=2, device="cuda", ddp_bucket_mb=mb)
    one = _one_device_step(opts)
    two = parity_step(opts)
    key = f"{backend}-b{mb}"
    err = max(float(np.max(np.abs(one[1][k] - two[1][k]))) for k in one[1])
    try:
        _assert_parity(one, two)
        ok = True
    except AssertionError as e:
        ok = str(e)[:300]
    out[key] = {"loss": [one[0], two[0]], "max_abs_param_diff": err, "moved": one[2], "ok": ok}
    print(key, out[key], flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
