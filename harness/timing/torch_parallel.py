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


def distribute(session, parallel: str, optimizer: str) -> None:
    """Wrap `session.model` for data parallelism, in place: DDP (gradients all-reduced to
    their mean in buckets during backward) or FSDP2 (`fully_shard` per block, then the
    whole model: parameters sharded, all-gathered for compute, gradients reduce-scattered).
    FSDP2 replaces the parameters with sharded DTensors, so the optimizer is rebuilt on them."""
    from harness.timing.torch_backend import make_optimizer

    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        device = session.device
        ids = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" \
            else None
        session.model = DistributedDataParallel(session.model, device_ids=ids)
        return
    from torch.distributed.fsdp import fully_shard

    for block in session.model.layers:
        fully_shard(block)
    fully_shard(session.model)
    session.optimizer = make_optimizer(session.model.parameters(), optimizer)


def full_params(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """Every parameter, whole, under the unwrapped model's names (DDP's `module.` prefix
    dropped, FSDP2's shards gathered)."""
    inner = getattr(model, "module", model)
    out = {}
    for name, p in inner.named_parameters():
        tensor = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[name] = tensor.detach().float().cpu().numpy().copy()
    return out
