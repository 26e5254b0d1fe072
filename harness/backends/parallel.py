"""Data parallelism as the backends offer it: each strategy's label in its framework's words,
which options go together on which backend, torch DDP's bucket size, and the environment
that keeps NCCL off NVLink multicast."""

from __future__ import annotations

import os

from harness import backends

# NVLink multicast (NVLS) off in NCCL, torch's symmetric memory and NVSHMEM: it can take a
# shared host's GPUs out of service (docs/several-gpus.md).
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def parallel_label(backend: str, parallel: str, short: bool = False) -> str:
    """The data-parallel strategy of `backend` under `--parallel`, as its framework names
    it (`Backend.parallel`); `short`: `short_label`."""
    label = backends.get(backend).parallel.get(parallel, parallel)
    return short_label(label) if short else label


def short_label(label: str) -> str:
    """A strategy's label without its explanation: the words before any bracket."""
    return label.split(" (")[0]


def parallel_problem(backend: str, parallel: str, ddp_bucket_mb: float | None = None, ddp_static_graph: bool = False,
                     grad_comm: str = "fp32", fsdp_reshard_after_forward: str = "true") -> str | None:
    """Why these data-parallel options do not go together on `backend` (one line naming the
    option and the fix), or None."""
    record = backends.get(backend)
    ddp = [name for name, on in (("--ddp-bucket-mb", ddp_bucket_mb), ("--ddp-static-graph", ddp_static_graph),
                                 ("--grad-comm bf16", grad_comm != "fp32")) if on]
    fsdp = ["--fsdp-reshard-after-forward false"] if fsdp_reshard_after_forward != "true" else []
    if not record.wrap_options and ddp + fsdp:
        return (f"{(ddp + fsdp)[0]} is an option of torch's DDP/FSDP2; {backend}'s strategies are --parallel "
                f"{', '.join(record.parallel)}")
    if parallel in record.parallel_refused:
        return f"--parallel {parallel}: {record.parallel_refused[parallel]}"
    if record.parallel and parallel not in record.parallel:  # none: no data parallelism to choose
        owners = [b.name for b in backends.all_backends() if parallel in b.parallel]
        theirs = parallel_label(owners[0], parallel, short=True)
        ours = " or ".join(f"{p} ({label})" for p, label in record.parallel.items())
        return f"--parallel {parallel} ({theirs}) is {', '.join(owners)}'s; for {backend} use --parallel {ours}"
    if ddp and parallel != "ddp":
        return f"{ddp[0]} configures DDP; use it with --parallel ddp"
    if fsdp and parallel != "fsdp":
        return f"{fsdp[0]} configures FSDP2; use it with --parallel fsdp"
    return None


DDP_DEFAULT_BUCKET_MB = 25.0  # torch DistributedDataParallel's bucket_cap_mb default


def bucket_mb(opts) -> float:
    """The DDP bucket size a run of `opts` (a RunSpec) uses, in MB: `--ddp-bucket-mb`,
    else its backend's default (`Backend.ddp_bucket_mb`), else DDP's own."""
    return opts.ddp_bucket_mb or backends.get(opts.backend).ddp_bucket_mb or DDP_DEFAULT_BUCKET_MB


def apply_safe_env() -> None:
    """Set each `SAFE_ENV` variable that is unset, in this process (so children inherit it)."""
    for key, value in SAFE_ENV.items():
        os.environ.setdefault(key, value)
