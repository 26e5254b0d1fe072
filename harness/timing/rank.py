"""One rank of a torch data-parallel run: the worker process `harness.timing.distributed` starts.

    python -m harness.timing.rank SPEC.json RANK

The launcher sets the `torch.distributed` env:// variables (MASTER_ADDR, MASTER_PORT,
RANK, WORLD_SIZE, LOCAL_RANK); the rank joins the process group (NCCL on CUDA, gloo on
CPU), takes one device (cuda:LOCAL_RANK), and runs the job the spec names on its shard
of the global batch: "run" (the timed run of `harness.timing.runner`, its document
written to `<dir>/rank<r>.json`) or "parity" (one optimizer step; rank 0 writes the
global-mean loss and the full parameters to `<dir>/parity.npz`). Exit status 3 when the
rank's run failed. `XFPROF_DP_KILL_RANK=r:SIGNAL` makes rank r kill itself with SIGNAL
(`r:exit`: exit with status 1) once the group is up, to test that the launcher ends the
run and names the rank.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
from collections.abc import Sequence

import numpy as np
import torch
import torch.distributed as dist

from harness.timing.distributed import SAFE_ENV, rank_path
from harness.timing.torch_parallel import full_params

KILL_HOOK = "XFPROF_DP_KILL_RANK"


def _kill_if_asked(rank: int) -> None:
    target, _, how = os.environ.get(KILL_HOOK, "").partition(":")
    if target != str(rank):
        return
    if how == "exit":
        raise SystemExit(f"{KILL_HOOK} asked rank {rank} to exit")
    os.kill(os.getpid(), getattr(signal, how or "SIGKILL"))


def _parity_step(opts, config) -> tuple[float, dict[str, np.ndarray]]:
    """Loss (mean over the global batch) and full parameters after one optimizer step."""
    from harness.timing.runner import make_session

    session = make_session(opts, config)
    loss = session.forward()
    session.backward()
    session.optimizer_step()
    dist.all_reduce(loss, op=dist.ReduceOp.SUM)
    return float(loss) / dist.get_world_size(), full_params(session.model)


def main(argv: Sequence[str]) -> int:
    from harness.config import get_config
    from harness.timing.runner import run
    from harness.timing.spec import RunSpec

    spec_path, rank = argv[0], int(argv[1])
    with open(spec_path) as f:
        spec = json.load(f)
    opts = RunSpec(**spec["options"])
    if opts.device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if opts.device == "cuda" else "gloo")
    _kill_if_asked(rank)
    workdir = os.path.dirname(spec_path)
    if spec["job"] == "parity":
        loss, params = _parity_step(opts, get_config(opts.model, attention=opts.attention))
        if rank == 0:
            np.savez(os.path.join(workdir, "parity.npz"), __loss__=np.float64(loss), **params)
        dist.destroy_process_group()
        return 0
    if opts.framework_profile:
        opts = dataclasses.replace(opts, framework_profile=rank_path(opts.framework_profile, rank))
    quiet = spec.get("quiet") or rank != 0
    doc = run(opts, (lambda m: None) if quiet else (lambda m: print(f"[rank {rank}] {m}", file=sys.stderr,
                                                                     flush=True)))
    doc["rank"] = rank
    doc["environment_seen"] = {k: os.environ.get(k) for k in SAFE_ENV}
    with open(os.path.join(workdir, f"rank{rank}.json"), "w") as f:
        json.dump(doc, f)
    if doc["status"] != "ok":
        print(f"rank {rank}: {doc['error']['message']}", file=sys.stderr, flush=True)
        return 3
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
