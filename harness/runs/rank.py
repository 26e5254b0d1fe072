"""One rank of a torch data-parallel run: the worker process `harness.runs.distributed` starts.

    python -m harness.runs.rank SPEC.json RANK

The launcher sets the `torch.distributed` env:// variables (MASTER_ADDR, MASTER_PORT,
RANK, WORLD_SIZE, LOCAL_RANK); the rank joins the process group (NCCL on CUDA, gloo on
CPU), takes one device (cuda:LOCAL_RANK), and runs the job the spec names on its shard
of the global batch: "run" (the timed run of `harness.timing.runner`, its document
written to `<dir>/rank<r>.json`) or "parity" (one optimizer step; rank 0 writes the
global-mean loss and the full parameters to `<dir>/parity.npz`). Exit status 3 when the
rank's run failed. `XFPROF_DP_KILL_RANK=r:SIGNAL` makes rank r kill itself with SIGNAL
(`r:exit`: exit with status 1) once the group is up, to test that the launcher ends the
run and names the rank; `XFPROF_DP_SLOW_RANK=r:seconds` makes rank r sleep that long at
the start of every forward, a planted straggler (`r:seconds:round`: before each of the
overhead check's timed rounds instead, a rank late to a round). Before a timed run every rank measures
the link: a few all-reduces of the gradients' size (`measure_link`), kept as `link`.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import signal
import sys
import time
from collections.abc import Sequence

import numpy as np
import torch
import torch.distributed as dist

from harness.backends.parallel import SAFE_ENV
from harness.backends.torch.parallel import full_params, measure_link
from harness.common.documents import RunDocument
from harness.runs.distributed import rank_path

KILL_HOOK = "XFPROF_DP_KILL_RANK"
SLOW_HOOK = "XFPROF_DP_SLOW_RANK"  # r:seconds[:round]: rank r sleeps that long before every forward (or round)


def _slow_if_asked(rank: int) -> None:
    """Test-only fault: a planted straggler, rank r late into every forward, or (`:round`)
    into every timed round of the overhead check, where the ranks align."""
    target, _, rest = os.environ.get(SLOW_HOOK, "").partition(":")
    if target != str(rank):
        return
    seconds, _, where = rest.partition(":")
    from harness.timing import runner

    make = runner.make_session

    def slowed(opts, config):
        session = make(opts, config)
        name = "align" if where == "round" else "forward"
        call = getattr(session, name)

        def late(*args, **kwargs):
            time.sleep(float(seconds))
            return call(*args, **kwargs)

        setattr(session, name, late)
        return session

    runner.make_session = slowed


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


def _shutdown() -> None:
    """Free what the job left in reference cycles, then destroy the process group.

    An FSDP2 model sits in reference cycles and holds the process group through its device
    mesh. Left to the interpreter's exit, the group's last reference goes mid-finalization,
    and gloo's worker threads can abort the rank ("terminate called without an active
    exception", SIGABRT). Collected first, the group is released while the interpreter is whole."""
    gc.collect()
    dist.destroy_process_group()


def main(argv: Sequence[str]) -> int:
    from harness import started
    from harness.config import get_config
    from harness.timing.runner import run
    from harness.timing.spec import RunSpec

    started()  # imports done: Ctrl-C is KeyboardInterrupt again
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
        _shutdown()
        return 0
    if opts.framework_profile:
        opts = dataclasses.replace(opts, framework_profile=rank_path(opts.framework_profile, rank))
    config = get_config(opts.model, attention=opts.attention)
    link = measure_link(config.num_params, torch.device(f"cuda:{os.environ['LOCAL_RANK']}" if opts.device == "cuda"
                                                        else "cpu"))
    _slow_if_asked(rank)
    quiet = spec.get("quiet") or rank != 0
    doc = run(opts, (lambda m: None) if quiet else (lambda m: print(f"[rank {rank}] {m}", file=sys.stderr,
                                                                     flush=True)))
    doc["rank"] = rank
    doc["link"] = link
    doc["environment_seen"] = {k: os.environ.get(k) for k in SAFE_ENV}
    with open(os.path.join(workdir, f"rank{rank}.json"), "w") as f:
        json.dump(doc, f)
    if not (result := RunDocument.from_dict(doc, f"rank {rank}'s document")).ok:
        print(f"rank {rank}: {result.message}", file=sys.stderr, flush=True)
        return 3
    _shutdown()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:  # the launcher stops its ranks and says so: no traceback per rank
        sys.exit(130)
