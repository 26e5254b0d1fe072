"""Scaling table: step time, tokens/s, MFU and scaling efficiency of one backend over device counts.

Runs at N = 1, 2, 4, 8 (harness.run result documents) keep the per-device batch fixed, so
ideal (weak) scaling multiplies tokens/s by N: efficiency = tokens/s at N / (N x tokens/s
at N = 1). Each run contributes its fastest whole training step: JAX's fused step where it
ran and is faster than its split step (what JAX users run), else `step`. The step of a
data-parallel run is its slowest rank's median (the pace of a synchronous step); MFU is
per device (one device's FLOPs over that step and the device's peak). Rows group by
backend, data-parallel strategy with its options (`strategy`: DDP's bucket size, static
graph and gradient dtype, FSDP2's resharding, the compiler (XLA, JAX, Inductor), allocator
and NCCL settings a run was given through its environment) and the shape of the run
(model, ctx, per-device batch, dtype, attention, device); each group's efficiency is
against the backend's one-device run of that shape under the same compiler and allocator
settings (NCCL's do not apply to one device), and a group without one has no efficiency.

Beside it, the loop's figures: the step as a training loop runs it, back to back with no
ranges and one synchronization per round (the timer's overhead check, where the ranks
start each round together), and the efficiency on that step. The two differ by what
the per-phase synchronization costs on the host, which a loop hides behind the device's
queue: JAX's dispatch to N devices, CUDA graph launches between phases.
"""

from __future__ import annotations

from collections import defaultdict

from harness import backends
from harness.backends.parallel import DDP_DEFAULT_BUCKET_MB, SAFE_ENV, parallel_label, short_label
from harness.common.documents import RunDocument

PHASES = ("forward", "backward", "optimizer")

SHAPE = ("model", "ctx", "batch", "dtype", "attention", "device")


def step_figures(doc: dict) -> tuple[int, str, float, float, float | None]:
    """(devices, step phase, step ms, global tokens/s, MFU per device) of an ok result
    document, for its fastest whole step (`step` or JAX's `fused_step`)."""
    o, dp = doc["options"], doc.get("data_parallel")
    n = dp["n"] if dp else 1
    times = {}
    for phase in ("step", "fused_step"):
        if phase not in doc["phases"]:
            continue
        slowest = (dp.get("spread") or {}).get(phase, {}).get("max_ms") if dp else None
        times[phase] = slowest or (dp["step_ms"] if dp and phase == "step" else doc["phases"][phase]["median_ms"])
    phase = min(times, key=times.__getitem__)
    step_ms, rec = times[phase], doc["phases"][phase]
    mfu = rec["mfu"] * rec["median_ms"] / step_ms if rec.get("mfu") else None  # the same FLOPs over the step
    return n, phase, step_ms, n * o["batch"] * o["ctx"] / (step_ms / 1e3), mfu


# Settings that change the program a run times: XLA's flags, Inductor's options (not where
# it caches), JAX's numerics options (not its platform or cache) and the device memory
# allocators' configuration (torch's caching allocator, the share of the GPU's memory XLA's
# client pool may take), which decides what fits. Whether XLA's pool is allocated up front
# (XLA_PYTHON_CLIENT_PREALLOCATE, which the harness sets where two processes share a GPU)
# is none: it moves no limit.
PROGRAM_SETTINGS = ("XLA_FLAGS", "TORCHINDUCTOR_", "PYTORCH_CUDA_ALLOC_CONF", "XLA_PYTHON_CLIENT_MEM_FRACTION",
                    "JAX_DEFAULT_MATMUL_PRECISION",
                    "JAX_ENABLE_X64", "JAX_DEFAULT_PRNG_IMPL", "JAX_THREEFRY_PARTITIONABLE")
CACHE_SETTINGS = ("TORCHINDUCTOR_CACHE_DIR", "TORCHINDUCTOR_FX_GRAPH_CACHE", "TORCHINDUCTOR_AUTOGRAD_CACHE")
# NCCL's tuning variables, torch's for its NCCL process group (the stream priority of its
# collectives) and the number of hardware queues a device's streams share change how the
# collectives run beside the compute, which one device never does; the library's version,
# its logging and the multicast switch every run sets are no settings.
COMM_SETTINGS = ("NCCL_", "TORCH_NCCL_", "CUDA_DEVICE_MAX_CONNECTIONS")
NOT_COMM_SETTINGS = ("NCCL_VERSION", "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")


def _recorded(doc: dict) -> dict[str, str]:
    return (doc.get("env") or {}).get("settings") or {}


def program_settings(doc: dict) -> str | None:
    """The settings among a run's recorded environment that change the program it timed,
    as "NAME=value" joined by ", " (None without any)."""
    kept = [f"{k}={v}" for k, v in sorted(_recorded(doc).items())
            if k.startswith(PROGRAM_SETTINGS) and k not in CACHE_SETTINGS]
    return ", ".join(kept) or None


def comm_settings(doc: dict) -> str | None:
    """The NCCL tuning a data-parallel run was given ("NAME=value" joined by ", ", None
    without any): it changes that run's collectives, so its row is its own, and it is set
    against the one-device run without it, which has no collective to tune."""
    kept = [f"{k}={v}" for k, v in sorted(_recorded(doc).items())
            if k.startswith(COMM_SETTINGS) and k not in NOT_COMM_SETTINGS and SAFE_ENV.get(k) != v]
    return ", ".join(kept) or None


def strategy(doc: dict) -> str:
    """A run's data-parallel strategy with the options it ran ("-" on one device), e.g.
    "DDP, 250 MB buckets, static graph"; a run given `program_settings` names them. A document from
    before the per-backend bucket default (no `bucket_mb` in its record) ran DDP's 25 MB
    unless it gave --ddp-bucket-mb."""
    o, dp = doc["options"], doc.get("data_parallel")
    parts = []
    if dp and dp["n"] > 1:
        parallel = o.get("parallel", "ddp")
        # the label the run recorded: what it ran, where the strategy changed since
        parts.append(short_label(dp.get("label") or parallel_label(o["backend"], parallel)))
        wrapped = backends.get(o["backend"]).wrap_options
        if wrapped and parallel == "ddp":
            mb = dp["bucket_mb"] if "bucket_mb" in dp else (o.get("ddp_bucket_mb") or DDP_DEFAULT_BUCKET_MB)
            parts.append(f"{mb:g} MB buckets")
            if o.get("ddp_static_graph"):
                parts.append("static graph")
            if o.get("grad_comm", "fp32") != "fp32":
                parts.append(f"{o['grad_comm']} gradients")
        if wrapped and parallel == "fsdp" and not o.get("fsdp_reshard_after_forward", True):
            parts.append("no reshard after forward")
    for given in (program_settings(doc), comm_settings(doc) if dp and dp["n"] > 1 else None):
        if given:
            parts.append(given)
    return ", ".join(parts) or "-"


def scaling_rows(docs: list[dict]) -> list[dict]:
    """One row per run that finished: its group, N, step ms, tokens/s and efficiency
    (None without an N = 1 run of the group), sorted by group then N."""
    groups: dict[tuple, dict[int, dict]] = defaultdict(dict)
    for doc in docs:
        if not RunDocument.from_dict(doc, need_schema=False).ok:
            continue
        o = doc["options"]
        n, phase, step_ms, tps, mfu = step_figures(doc)
        parallel = strategy(doc)
        key = (o["backend"], parallel, *(o[k] for k in SHAPE))
        if n in groups[key]:
            raise ValueError(f"two runs of {o['backend']} ({parallel}) at N = {n} with the same shape; give one of "
                             "each")
        groups[key][n] = {"backend": o["backend"], "parallel": parallel, "n": n, "phase": phase, "step_ms": step_ms,
                          "tokens_per_s": tps, "mfu": mfu, "shape": dict(zip(SHAPE, key[2:])),
                          "settings": program_settings(doc), "loop_ms": (loop := loop_step_ms(doc)),
                          "loop_doubt": loop_doubt(doc, step_ms, loop), **_phase_figures(doc, phase)}
    rows = []
    for key in sorted(groups, key=lambda k: (k[0], str(k[1]), *map(str, k[2:]))):
        base = groups[key].get(1) or _one_device(groups, key)
        for n in sorted(groups[key]):
            row = groups[key][n]
            row["efficiency"] = row["tokens_per_s"] / (n * base["tokens_per_s"]) if base else None
            # the per-device batch is fixed, so the tokens/s ratio is the ratio of the steps
            row["loop_efficiency"] = (base["loop_ms"] / row["loop_ms"] if base and base["loop_ms"] and row["loop_ms"]
                                      and not base["loop_doubt"] and not row["loop_doubt"] else None)
            row["growth"] = _growth(row, base) if base and n > 1 else None
            rows.append(row)
    return rows


def loop_step_ms(doc: dict) -> float | None:
    """A run's step in a loop, ms: the overhead check's plain steps (back to back, one
    synchronization per round; the median of its rounds' mean step), the slowest rank's
    where the ranks recorded theirs, else the one process's (or, in documents from before
    the ranks kept theirs, rank 0's); None where the run made no overhead check."""
    per_rank = [(r.get("overhead") or {}).get("plain_step_ms") for r in doc.get("ranks") or []]
    if per_rank and all(v is not None for v in per_rank):
        return max(per_rank)
    return (doc.get("overhead") or {}).get("plain_step_ms")


def loop_doubt(doc: dict, step_ms: float, loop: float | None) -> str | None:
    """Why a run's loop step `loop` (`loop_step_ms`) cannot be set against others (None
    where it can): a loop without synchronizations between phases slower than the
    synchronized step `step_ms`, or an overhead check that flagged itself, means the host
    was busier during the check than during the measured steps."""
    checks = [r["overhead"] for r in doc.get("ranks") or [] if r.get("overhead")] or [doc.get("overhead") or {}]
    if any(c.get("flag") for c in checks):
        return "the run's overhead check flagged its rounds"
    if loop is not None and loop > step_ms:
        return "slower than the synchronized step"
    return None


def _phase_figures(doc: dict, step: str) -> dict:
    """The phases of the step a row counts (forward, backward, optimizer: the slowest rank's
    medians; none for JAX's fused step, one range), the all-reduce of the gradients alone
    on the run's link (`link_ms`) and the mean waiting for the last rank per step that the
    ranks' host timings show (`waiting_ms`), where the run has them."""
    dp = doc.get("data_parallel") or {}
    phases = {}
    if step == "step":
        for name in PHASES:
            slowest = ((dp.get("spread") or {}).get(name) or {}).get("max_ms")
            rec = doc["phases"].get(name)
            if slowest is not None or rec:
                phases[name] = slowest if slowest is not None else rec["median_ms"]
    # under FSDP2 the host timings cannot tell waiting from computing (`distributed.host_split`),
    # whatever split an older document carries
    split = dp.get("host_split") if dp.get("parallel", "ddp") == "ddp" else None
    waiting = (sum(r["waiting_ms_per_step"] for r in split["ranks"]) / len(split["ranks"])
               if split and split.get("ranks") else None)
    return {"phases_ms": phases, "link_ms": (dp.get("link") or {}).get("median_ms"), "waiting_ms": waiting}


def _growth(row: dict, base: dict) -> dict:
    """What the step gained over the one-device run, ms: the whole step, and each phase the
    two have in common where both count the split step."""
    out = {"step": row["step_ms"] - base["step_ms"], "phases": {}}
    if row["phase"] == base["phase"] == "step":
        out["phases"] = {p: row["phases_ms"][p] - base["phases_ms"][p] for p in PHASES
                         if p in row["phases_ms"] and p in base["phases_ms"]}
    return out


def _one_device(groups: dict[tuple, dict[int, dict]], key: tuple) -> dict | None:
    """The N = 1 run of a data-parallel group's backend and shape (one device has no
    strategy) given the group's settings: a run under other compiler settings times another
    program, so a group without such a run has no efficiency."""
    ones = [g[1] for k, g in groups.items() if 1 in g and k[0] == key[0] and k[2:] == key[2:]]
    given = next(iter(groups[key].values()))["settings"]
    return next((run for run in ones if run["settings"] == given), None)
