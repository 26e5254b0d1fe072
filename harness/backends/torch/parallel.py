"""torch data parallelism inside one rank: the process group's coordinates and the model wrap.

`harness.timing.runner.make_session` calls `distribute` on a rank's session; the parity
check reads whole parameters back with `full_params`."""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist


def world() -> tuple[int, int]:
    """(rank, world size) of this process; (0, 1) outside a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def distribute(session, opts) -> None:
    """Wrap `session.model` for data parallelism as `opts` (a RunSpec) asks, in place.

    DDP: gradients all-reduced to their mean in buckets during backward, with
    `--ddp-bucket-mb` (bucket_cap_mb; when not given, the backend record's `ddp_bucket_mb`:
    250 MB for the compiled backends, DDP's 25 MB for eager), `--ddp-static-graph` and
    `--grad-comm bf16` (the bf16 compression hook: gradients cast to bf16 for the
    all-reduce, halving its bytes);
    gradient_as_bucket_view is on, so the gradients are views into the buckets and not
    copied into them after each backward. A compiled session's loss calls the wrapped
    model, so torch.compile traces DDP's forward (Dynamo's DDPOptimizer splits the graph
    at bucket boundaries so the all-reduces can overlap the backward).
    FSDP2: `fully_shard` per block, then the whole model (parameters sharded, all-gathered
    for compute, gradients reduce-scattered); `--fsdp-reshard-after-forward false` keeps
    the gathered parameters from the forward to the backward (one all-gather fewer, more
    memory). FSDP2 replaces the parameters with sharded DTensors, so the optimizer is
    rebuilt on them."""
    from harness.backends.parallel import bucket_mb
    from harness.backends.torch.session import make_optimizer

    if opts.parallel == "ddp":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook
        from torch.nn.parallel import DistributedDataParallel

        device = session.device
        ids = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" \
            else None
        session.model = DistributedDataParallel(session.model, device_ids=ids, gradient_as_bucket_view=True,
                                                bucket_cap_mb=bucket_mb(opts), static_graph=opts.ddp_static_graph)
        if opts.grad_comm == "bf16":
            session.model.register_comm_hook(dist.group.WORLD, bf16_compress_hook)
        return
    from torch.distributed.fsdp import fully_shard

    for block in session.model.layers:
        fully_shard(block, reshard_after_forward=opts.fsdp_reshard_after_forward)
    fully_shard(session.model, reshard_after_forward=opts.fsdp_reshard_after_forward)
    session.optimizer = make_optimizer(session.model.parameters(), opts.optimizer)


LINK_REPEATS = 5


def measure_link(numel: int, device: torch.device, repeats: int = LINK_REPEATS) -> dict:
    """The link as the gradients' all-reduce sees it: `repeats` timed all-reduces of
    `numel` float32 values (after one untimed), each started together after a barrier and
    ended by a device synchronization; the median's algorithm and bus bandwidth (NCCL's
    convention, bus = algorithm x 2(N-1)/N)."""
    import statistics
    import time

    n = dist.get_world_size()
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    x = torch.ones(numel, dtype=torch.float32, device=device)
    dist.all_reduce(x)
    times = []
    for _ in range(repeats):
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        dist.all_reduce(x)
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    del x
    ms = statistics.median(times)
    algbw = numel * 4 / (ms / 1e3) / 1e9
    return {"bytes": numel * 4, "times_ms": times, "median_ms": ms, "algbw_gbps": algbw,
            "busbw_gbps": algbw * 2 * (n - 1) / n, "backend": dist.get_backend(),
            "method": f"{repeats} all-reduces of the gradients' size (float32) after one untimed, each after a barrier "
                      "and ended by a device synchronization; median"}


def full_params(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """Every parameter, whole, under the unwrapped model's names (DDP's `module.` prefix
    dropped, FSDP2's shards gathered)."""
    inner = getattr(model, "module", model)
    out = {}
    for name, p in inner.named_parameters():
        tensor = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[name] = tensor.detach().float().cpu().numpy().copy()
    return out
