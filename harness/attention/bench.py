"""Attention kernel benchmark: our Pallas FlashAttention kernels against XLA, cuDNN,
JAX's Pallas `mha` and PyTorch SDPA backends.

    python -m harness.bench_attention --seq 1024,4096 --head-dim 64 --dtype bf16
    python -m harness.bench_attention --shapes fa3 --dtype bf16      # FA3 paper's shape set
    python -m harness.bench_attention --shapes leaderboard            # 16 x 16384 x 64, causal

Our kernels appear twice: `pallas` is the portable kernel (Triton lowering,
forced), `pallas_mosaic` the Hopper kernel (Pallas Mosaic GPU, forced; needs
compute capability 9.x).

Times forward, backward (given saved residuals) and forward+backward, each the
median over `--iters` repeats of back-to-back launches (after warm-up), with
the min-max spread. A repeat launches enough calls to last `--min-batch-ms`,
so its fixed cost (first launch, final sync) is spread thin; the
implementations of one cell take their repeats in rotating rounds, so drift
over the run (temperature) falls on all of them alike. Each timed repeat
follows `--lead-in-ms` of untimed calls of the same pass: a GPU at its power
limit sets its clock from the power drawn over roughly the last 100 ms, so
without a lead-in a 25 ms repeat runs at a clock set by whatever ran before
it, and in a fixed rotation that is always the same neighbour (on an H100 one
reference's forward measured 10% faster in the rounds than in its own
steady state, ours 2%). With it, each pass is timed at its own steady state,
as it would run in a loop of its own.

FLOP convention: forward = 4*B*H*S^2*D (QK^T and PV), halved when causal;
backward = 2.5x forward (five matmuls instead of two); forward+backward =
3.5x forward. D is the true head_dim, not the padded one.
Ratios are time / time of the fastest PyTorch SDPA backend for the same cell
and pass (measured in the same run), so < 1 means faster than SDPA. The
`<pass>_speedup_vs_best` fields are the other way round, a throughput ratio
against the fastest of all SDPA backends and cuDNN through JAX: >= 1 means at
least as fast as the best reference.

Shape sets (--shapes): `grid` (default) crosses --seq, --head-dim with the
fixed --batch and --heads; `fa3` is the FlashAttention-3 paper's set, seq 512
to 16384 (filtered by --seq) with batch*seq = 16384 tokens and
heads*head_dim = 2048; `leaderboard` is q, k, v of 16 x 16384 x 64 (batch 16,
one head), causal.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

# JAX would otherwise reserve most of the GPU up front and starve PyTorch.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from harness import hardware  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
PASSES = ("fwd", "bwd", "fwd_bwd")
PASS_FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}
SDPA_IMPLS = ("torch_sdpa_flash", "torch_sdpa_efficient", "torch_sdpa_cudnn")
IMPLS = ("pallas", "pallas_mosaic", "jax_pallas_mha", "jax_cudnn", "xla_naive", *SDPA_IMPLS, "torch_naive")
GPU_ONLY = ("pallas_mosaic", "jax_pallas_mha", "jax_cudnn", *SDPA_IMPLS)
# References for the throughput targets: every SDPA backend and cuDNN via JAX.
BEST_REF_IMPLS = (*SDPA_IMPLS, "jax_cudnn")
SHAPE_SETS = ("grid", "fa3", "leaderboard")
FA3_TOKENS = 16384
FA3_HIDDEN = 2048
FA3_SEQS = (512, 1024, 2048, 4096, 8192, 16384)
DTYPES = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}
DEFAULT_SEQS = tuple(2**p for p in range(7, 15))
# Non-causal cells are only run from this length up when --causal both.
NONCAUSAL_MIN_SEQ = 1024
# Untimed calls of a pass before each of its timed repeats. An H100 at its
# power limit changed its SM clock in steps about 100 ms apart and had
# settled 200 ms after switching from one attention implementation to another.
LEAD_IN_MS = 200.0


def lead_in_ms(value: str) -> float:
    """argparse type of --lead-in-ms (here and in harness.tune_attention):
    milliseconds >= 0, where 0 turns the lead-in off."""
    try:
        ms = float(value)
    except ValueError:
        ms = float("nan")
    if not ms >= 0:
        raise argparse.ArgumentTypeError(f"must be milliseconds >= 0 (0 turns the lead-in off), got {value!r}")
    return ms


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    def int_list(text: str) -> list[int]:
        return [int(x) for x in text.split(",") if x]

    def str_list(choices: tuple[str, ...]) -> Callable[[str], list[str]]:
        def parse(text: str) -> list[str]:
            items = [x for x in text.split(",") if x]
            bad = [x for x in items if x not in choices]
            if bad:
                raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {', '.join(choices)}")
            return items

        return parse

    p = argparse.ArgumentParser(prog="python -m harness.bench_attention", description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", choices=SHAPE_SETS, default="grid",
                   help="grid: --seq x --head-dim at --batch/--heads; fa3: batch*seq=16384, heads*head_dim=2048 "
                        "(--seq filters, default 1024..16384); leaderboard: 16 x 16384 x 64 causal")
    p.add_argument("--seq", type=int_list, default=None,
                   help=f"comma-separated sequence lengths (grid default {','.join(map(str, DEFAULT_SEQS))})")
    p.add_argument("--head-dim", type=int_list, default=None, help="grid default 64,80,128; fa3 default 64,128")
    p.add_argument("--dtype", type=str_list(tuple(DTYPES)), default=["bf16", "fp32"])
    p.add_argument("--impl", type=str_list(IMPLS), default=list(IMPLS))
    p.add_argument("--causal", choices=("true", "false", "both"), default="both",
                   help=f"'both' adds non-causal cells for seq >= {NONCAUSAL_MIN_SEQ}")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=15, help="timed repeats per pass (median reported)")
    p.add_argument("--min-batch-ms", type=float, default=25.0,
                   help="launches per repeat are chosen so that a repeat lasts at least this long")
    p.add_argument("--lead-in-ms", type=lead_in_ms, default=LEAD_IN_MS,
                   help="untimed calls of the same pass for at least this long before each timed repeat, so the "
                        "clock under a power limit has settled to that pass (0: none)")
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu",
                   help="cpu: tiny smoke runs (Pallas in interpret mode, GPU-only impls marked unsupported)")
    p.add_argument("--out", type=Path, default=None, help="default: results/attention-<gpu>/")
    p.add_argument("--name", default="attention", help="stem of the .json/.png/.md files written")
    p.add_argument("--render", type=Path, nargs="+", default=None, metavar="JSON",
                   help="run nothing: rewrite the .md and .png of these results JSON files from them alone")
    args = p.parse_args(argv)
    if args.shapes == "fa3":
        args.seq = args.seq or [s for s in FA3_SEQS if s >= 1024]
        args.head_dim = args.head_dim or [64, 128]
        bad = [d for d in args.head_dim if FA3_HIDDEN % d] + [s for s in args.seq if FA3_TOKENS % s]
        if bad:
            p.error(f"--shapes fa3 needs head_dim dividing {FA3_HIDDEN} and seq dividing {FA3_TOKENS}; got {bad}")
    else:
        args.seq = args.seq or list(DEFAULT_SEQS)
        args.head_dim = args.head_dim or [64, 80, 128]
    return args


def cells(args: argparse.Namespace) -> list[dict]:
    if args.shapes == "leaderboard":
        return [dict(batch=16, heads=1, seq=16384, head_dim=64, dtype=DTYPES[dtype], causal=True)
                for dtype in args.dtype]
    out = []
    for dtype in args.dtype:
        for head_dim in args.head_dim:
            for seq in args.seq:
                flags = {"true": [True], "false": [False], "both": [True, False]}[args.causal]
                for causal in flags:
                    if args.causal == "both" and not causal and seq < NONCAUSAL_MIN_SEQ:
                        continue
                    if args.shapes == "fa3":
                        batch, heads = FA3_TOKENS // seq, FA3_HIDDEN // head_dim
                    else:
                        batch, heads = args.batch, args.heads
                    out.append(dict(batch=batch, heads=heads, seq=seq, head_dim=head_dim,
                                    dtype=DTYPES[dtype], causal=causal))
    return out


def fwd_flops(cell: dict) -> float:
    flops = 4.0 * cell["batch"] * cell["heads"] * cell["seq"] ** 2 * cell["head_dim"]
    return flops / 2 if cell["causal"] else flops


# ----------------------------------------------------------------------------
# Implementations. Each builder returns ({pass: thunk}, sync, timer kind);
# JAX works in [batch, seq, heads, dim], PyTorch in [batch, heads, seq, dim].


def _jax_attention(impl: str, interpret: bool, block_sizes: object = None) -> Callable:
    if impl in ("pallas", "pallas_mosaic"):
        from pallas_kernels import flash_attention

        backend = "triton" if impl == "pallas" else "mosaic"
        return lambda q, k, v, causal: flash_attention(q, k, v, causal=causal, interpret=interpret,
                                                       backend=backend, block_sizes=block_sizes)
    if block_sizes is not None:
        raise ValueError(f"block_sizes apply to our kernels only, not {impl=}")
    if impl == "jax_cudnn":
        return lambda q, k, v, causal: jax.nn.dot_product_attention(q, k, v, is_causal=causal,
                                                                    implementation="cudnn")
    if impl == "jax_pallas_mha":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from jax.experimental.pallas.ops.gpu import attention as jax_attention

        return lambda q, k, v, causal: jax_attention.mha(q, k, v, None, sm_scale=1 / math.sqrt(q.shape[-1]),
                                                         causal=causal)
    if impl == "xla_naive":
        def naive(q, k, v, causal):
            s = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / math.sqrt(q.shape[-1])
            if causal:
                s = jnp.where(jnp.tril(jnp.ones(s.shape[-2:], bool)), s, -jnp.inf)
            p = jax.nn.softmax(s, axis=-1).astype(q.dtype)
            return jnp.einsum("bhqk,bkhd->bqhd", p, v)

        return naive
    raise ValueError(f"{impl=} is not a JAX implementation")


def _build_jax(impl: str, cell: dict, device: str, block_sizes: object = None):
    attention = _jax_attention(impl, interpret=device == "cpu", block_sizes=block_sizes)
    shape = (cell["batch"], cell["seq"], cell["heads"], cell["head_dim"])
    keys = jax.random.split(jax.random.key(0), 4)
    q, k, v, do = (jax.random.normal(key, shape, jnp.float32).astype(cell["dtype"]) for key in keys)

    def f(q, k, v):
        return attention(q, k, v, cell["causal"])

    fwd = jax.jit(f)
    fwd_bwd = jax.jit(lambda q, k, v, do: jax.vjp(f, q, k, v)[1](do))
    # The residuals come back as a pytree (jax.tree_util.Partial), so the
    # backward alone can be jitted and timed from them.
    _, vjp_fn = jax.jit(lambda q, k, v: jax.vjp(f, q, k, v))(q, k, v)
    bwd = jax.jit(lambda vjp_fn, do: vjp_fn(do))
    thunks = {"fwd": lambda: fwd(q, k, v), "bwd": lambda: bwd(vjp_fn, do),
              "fwd_bwd": lambda: fwd_bwd(q, k, v, do)}
    return thunks, jax.block_until_ready, "wall"


def _build_torch(impl: str, cell: dict, device: str):
    import torch
    import torch.nn.functional as F

    dev = "cuda" if device == "gpu" else "cpu"
    dtype = getattr(torch, cell["dtype"])
    shape = (cell["batch"], cell["heads"], cell["seq"], cell["head_dim"])
    gen = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(shape, device=dev, dtype=dtype, generator=gen).requires_grad_() for _ in range(3))
    do = torch.randn(shape, device=dev, dtype=dtype, generator=gen)
    causal = cell["causal"]

    if impl == "torch_naive":
        future = torch.ones(shape[-2], shape[-2], dtype=torch.bool, device=dev).triu(1)

        def attention(q, k, v):
            s = (q @ k.transpose(-1, -2)).float() / math.sqrt(q.shape[-1])
            if causal:
                s = s.masked_fill(future, float("-inf"))
            return torch.softmax(s, dim=-1).to(q.dtype) @ v

        context = contextlib.nullcontext
    else:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = {"torch_sdpa_flash": SDPBackend.FLASH_ATTENTION,
                   "torch_sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
                   "torch_sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}[impl]

        def attention(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        def context():
            return sdpa_kernel(backend)

    def fwd():
        with context(), torch.no_grad():
            return attention(q, k, v)

    with context():
        out = attention(q, k, v)

    def bwd():
        return torch.autograd.grad(out, (q, k, v), do, retain_graph=True)

    def fwd_bwd():
        with context():
            return torch.autograd.grad(attention(q, k, v), (q, k, v), do)

    sync = torch.cuda.synchronize if dev == "cuda" else (lambda *_: None)
    return {"fwd": fwd, "bwd": bwd, "fwd_bwd": fwd_bwd}, sync, "cuda" if dev == "cuda" else "wall"


# Calls per repeat are capped so that a fast pass cannot make one repeat run
# for seconds on a CPU smoke run.
MAX_CALLS_PER_REPEAT = 1000


def calls_per_repeat(thunk: Callable, sync: Callable, timer: str, warmup: int, min_batch_ms: float) -> int:
    """Warms `thunk` up, then returns how many back-to-back calls make one
    repeat last at least `min_batch_ms`, found by timing growing batches.

    A repeat pays a fixed cost once (the first launch reaching an idle GPU,
    the final synchronization: tens of microseconds, now and then
    milliseconds); spread over too few calls it inflates short passes (with
    3 ms repeats it added 10-15% to a 0.25 ms forward on an H100). Timing a
    single call would count that cost in full and pick too few calls."""
    for _ in range(warmup):
        sync(thunk())
    n = 1
    while n < MAX_CALLS_PER_REPEAT:
        batch_ms = repeat_ms(thunk, sync, timer, n) * n
        if batch_ms >= min_batch_ms:
            break
        n = min(MAX_CALLS_PER_REPEAT, max(2 * n, math.ceil(1.2 * n * min_batch_ms / max(batch_ms, 1e-3))))
    return n


def repeat_ms(thunk: Callable, sync: Callable, timer: str, n: int) -> float:
    """One repeat: `n` back-to-back calls; milliseconds per call (CUDA events
    for PyTorch, the host clock around launches and one final sync for JAX)."""
    if timer == "cuda":
        import torch

        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(n):
            thunk()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) / n
    start = time.perf_counter()
    for _ in range(n):
        result = thunk()
    sync(result)
    return (time.perf_counter() - start) * 1e3 / n


def lead_in(thunk: Callable, sync: Callable, timer: str, n: int, ms: float) -> None:
    """Untimed repeats of `n` calls until at least `ms` milliseconds have passed."""
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        repeat_ms(thunk, sync, timer, n)


def time_interleaved(entries: dict, *, warmup: int, iters: int, min_batch_ms: float,
                     lead_in_ms: float = 0.0) -> dict[object, tuple[float, float, float] | Exception]:
    """Times every entry (key -> (thunk, sync, timer)) with `iters` repeats,
    taken in rounds: one repeat of each entry per round, the order rotated by
    one each round, so drift over the run lands on every entry alike instead
    of on whichever ran last. With `lead_in_ms`, each timed repeat follows
    that long of untimed calls of the same entry (see the module docstring).

    Returns key -> (median, min, max) ms per call, or the exception that
    entry raised (it is dropped from later rounds; the others go on)."""
    out: dict[object, tuple[float, float, float] | Exception] = {}
    calls: dict[object, int] = {}
    for key, (thunk, sync, timer) in entries.items():
        try:
            calls[key] = calls_per_repeat(thunk, sync, timer, warmup, min_batch_ms)
        except Exception as exc:  # noqa: BLE001 -- reported per entry
            out[key] = exc
    samples: dict[object, list[float]] = {key: [] for key in calls}
    keys = list(calls)
    for round_ in range(iters):
        shift = round_ % len(keys) if keys else 0
        for key in keys[shift:] + keys[:shift]:
            if key in out:
                continue
            thunk, sync, timer = entries[key]
            try:
                if lead_in_ms > 0:
                    lead_in(thunk, sync, timer, calls[key], lead_in_ms)
                samples[key].append(repeat_ms(thunk, sync, timer, calls[key]))
            except Exception as exc:  # noqa: BLE001
                out[key] = exc
    for key, got in samples.items():
        if key not in out:
            out[key] = (statistics.median(got), min(got), max(got))
    return out


def _time_ms(thunk: Callable, sync: Callable, timer: str, args: argparse.Namespace) -> tuple[float, float, float]:
    """(median, min, max) milliseconds per call over args.iters repeats of one thunk."""
    got = time_interleaved({0: (thunk, sync, timer)}, warmup=args.warmup, iters=args.iters,
                           min_batch_ms=args.min_batch_ms, lead_in_ms=args.lead_in_ms)[0]
    if isinstance(got, Exception):
        raise got
    return got


def _failure(exc: BaseException, caught: list) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if "Shared memory size limit" in text:
        return "unsupported: tiles exceed shared memory"
    if "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower() or "OutOfMemory" in text:
        return "OOM"
    # PyTorch explains "No available kernel" in warnings; keep the first reason.
    reasons = [str(w.message).splitlines()[0] for w in caught if "kernel" in str(w.message).lower()]
    line = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
    if reasons:
        line = f"{line} ({reasons[0]})"
    return f"unsupported: {line[:160]}"


def _release_memory() -> None:
    if "torch" in sys.modules:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def measure_cell(cell: dict, impls: list[str], args: argparse.Namespace) -> list[dict]:
    """Times every pass of every implementation on one cell, their repeats
    interleaved (time_interleaved); one row per implementation, a failure
    (unsupported, OOM, compile error) marking that row only."""
    rows = {impl: {"impl": impl, **cell, "status": "ok"} for impl in impls}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        entries = {}
        try:
            for impl in impls:
                if args.device == "cpu" and impl in GPU_ONLY:
                    rows[impl]["status"] = "unsupported: needs a GPU"
                    continue
                builder = _build_torch if impl.startswith("torch") else _build_jax
                try:
                    thunks, sync, timer = builder(impl, cell, args.device)
                except Exception as exc:  # noqa: BLE001 -- every failure becomes a marked row
                    rows[impl]["status"] = _failure(exc, caught)
                    continue
                entries.update({(impl, name): (thunks[name], sync, timer) for name in PASSES})
            timed = time_interleaved(entries, warmup=args.warmup, iters=args.iters, min_batch_ms=args.min_batch_ms,
                                     lead_in_ms=args.lead_in_ms)
            for (impl, name), got in timed.items():
                row = rows[impl]
                if isinstance(got, Exception):
                    if row["status"] == "ok":
                        row["status"] = _failure(got, caught)
                    continue
                median, lo, hi = got
                row[f"{name}_ms"] = median
                row[f"{name}_ms_spread"] = [lo, hi]
                row[f"{name}_tflops"] = fwd_flops(cell) * PASS_FLOP_FACTOR[name] / (median * 1e-3) / 1e12
        finally:
            entries = thunks = None
            _release_memory()
    for row in rows.values():  # a failed pass voids the row's other passes too
        if row["status"] != "ok":
            for name in PASSES:
                for suffix in ("_ms", "_ms_spread", "_tflops"):
                    row.pop(f"{name}{suffix}", None)
    return list(rows.values())


def run_benchmark(args: argparse.Namespace) -> list[dict]:
    """Measures every requested (cell, impl); returns one dict per pair.

    Stopped part-way (Ctrl-C, or SIGTERM under `main`, e.g. from a time
    limit), it returns the cells measured completely so far and sets
    `args.stopped_after` to their number."""
    rows = []
    args.stopped_after = None
    device = jax.devices("cpu")[0] if args.device == "cpu" else jax.devices()[0]
    with jax.default_device(device):
        todo, done = cells(args), 0
        try:
            for cell in todo:
                cell_rows = []
                for row in measure_cell(cell, args.impl, args):
                    cell_rows.append(row)
                    print(_progress_line(row), file=sys.stderr, flush=True)
                rows += cell_rows
                done += 1
        except KeyboardInterrupt:
            args.stopped_after = done
            print(f"bench_attention: stopped; keeping the {done} cell(s) measured completely "
                  f"(of {len(todo)})", file=sys.stderr, flush=True)
    add_sdpa_ratios(rows)
    add_best_ref_speedups(rows)
    return rows


def _cell_key(row: dict) -> tuple:
    return tuple(row[k] for k in ("batch", "heads", "seq", "head_dim", "dtype", "causal"))


def _fastest(rows: list[dict], impls: tuple[str, ...]) -> dict[tuple, dict[str, tuple[float, str]]]:
    """Per cell and pass: (time, impl) of the fastest of `impls` that ran."""
    best: dict[tuple, dict[str, tuple[float, str]]] = {}
    for row in rows:
        if row["impl"] in impls and row["status"] == "ok":
            entry = best.setdefault(_cell_key(row), {})
            for name in PASSES:
                if row[f"{name}_ms"] < entry.get(name, (math.inf, ""))[0]:
                    entry[name] = (row[f"{name}_ms"], row["impl"])
    return best


def add_sdpa_ratios(rows: list[dict]) -> None:
    """Adds `<pass>_vs_sdpa` = time / fastest SDPA backend's time (per pass)."""
    best = _fastest(rows, SDPA_IMPLS)
    for row in rows:
        for name in PASSES:
            ref = best.get(_cell_key(row), {}).get(name)
            ok = row["status"] == "ok" and ref is not None
            row[f"{name}_vs_sdpa"] = row[f"{name}_ms"] / ref[0] if ok else None


def add_best_ref_speedups(rows: list[dict]) -> None:
    """Adds `<pass>_speedup_vs_best` = fastest reference's time / this time
    (a throughput ratio; >= 1 meets the target) and `<pass>_best_ref`, the
    reference that was fastest. References: BEST_REF_IMPLS."""
    best = _fastest(rows, BEST_REF_IMPLS)
    for row in rows:
        for name in PASSES:
            ref = best.get(_cell_key(row), {}).get(name)
            ok = row["status"] == "ok" and ref is not None
            row[f"{name}_speedup_vs_best"] = ref[0] / row[f"{name}_ms"] if ok else None
            row[f"{name}_best_ref"] = ref[1] if ref is not None else None


# ----------------------------------------------------------------------------
# Rendering.


def _progress_line(row: dict) -> str:
    desc = (f"{row['impl']:22s} b={row['batch']:<3d} h={row['heads']:<3d} s={row['seq']:<6d} d={row['head_dim']:<4d} "
            f"{row['dtype']:9s} causal={row['causal']!s:5s}")
    if row["status"] != "ok":
        return f"{desc} {row['status']}"
    return f"{desc} " + " ".join(f"{n}={row[f'{n}_ms']:.3f}ms" for n in PASSES)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render_table(rows: list[dict], markdown: bool = False) -> str:
    header = ["impl", "B", "H", "seq", "D", "dtype", "causal", "fwd ms", "bwd ms", "f+b ms", "fwd TFLOP/s",
              "bwd TFLOP/s", "f+b TFLOP/s", "fwd/SDPA", "bwd/SDPA", "f+b/SDPA", "fwd xbest", "bwd xbest",
              "f+b xbest", "status"]
    lines = []
    for row in rows:
        ok = row["status"] == "ok"
        lines.append([
            row["impl"], str(row["batch"]), str(row["heads"]), str(row["seq"]), str(row["head_dim"]), row["dtype"],
            "yes" if row["causal"] else "no",
            *(_fmt(row.get(f"{n}_ms") if ok else None, ".3f") for n in PASSES),
            *(_fmt(row.get(f"{n}_tflops") if ok else None, ".3g") for n in PASSES),
            *(_fmt(row.get(f"{n}_vs_sdpa"), ".2f") for n in PASSES),
            *(_fmt(row.get(f"{n}_speedup_vs_best"), ".2f") for n in PASSES),
            row["status"],
        ])
    if markdown:
        out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join(out + ["| " + " | ".join(line) + " |" for line in lines])
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:{w}s}}" for w in widths)
    return "\n".join([fmt.format(*header)] + [fmt.format(*line) for line in lines])


def environment(args: argparse.Namespace, interleaved: bool = True) -> dict:
    """Machine, versions and the timing method (`interleaved`: a cell's
    implementations took their repeats in rotating rounds)."""
    rounds = ("; a cell's implementations and passes take their repeats in rotating rounds" if interleaved
              else "; one configuration timed to completion after another")
    rounds += (f"; each timed repeat follows >= {args.lead_in_ms:g} ms of untimed calls of the same pass"
               if args.lead_in_ms else "; no lead-in before a timed repeat")
    extra = {
        "device": jax.devices()[0].device_kind,
        "stopped_after_cells": getattr(args, "stopped_after", None),
        "jax": jax.__version__,
        "jaxlib": __import__("jaxlib").__version__,
        "flop_convention": "fwd 4*B*H*S^2*D (causal /2); bwd 2.5x fwd; fwd+bwd 3.5x fwd",
        "timing": f"median of {args.iters} repeats after {args.warmup} warm-up calls; each repeat times "
                  f"back-to-back launches lasting >= {args.min_batch_ms:g} ms (CUDA events for PyTorch, "
                  f"block_until_ready for JAX){rounds}",
    }
    for module in ("torch", "triton"):
        try:
            extra[module] = __import__(module).__version__
        except ImportError:
            extra[module] = None
    if extra["torch"]:
        import torch

        extra["torch_cuda"] = torch.version.cuda
        extra["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return hardware.environment(extra)


def render_plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["dtype"], r["head_dim"], r["causal"]) for r in rows}, key=str)
    cols = min(3, len(groups))
    nrows = math.ceil(len(groups) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.5 * cols, 4 * nrows), squeeze=False)
    for ax, (dtype, head_dim, causal) in zip(axes.flat, groups):
        for impl in dict.fromkeys(r["impl"] for r in rows):
            pts = [(r["seq"], r["fwd_bwd_tflops"]) for r in rows
                   if (r["impl"], r["dtype"], r["head_dim"], r["causal"]) == (impl, dtype, head_dim, causal)
                   and r["status"] == "ok"]
            if pts:
                xs, ys = zip(*sorted(pts))
                ax.plot(xs, ys, marker="o", label=impl, linewidth=2.5 if impl.startswith("pallas") else 1.2)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length")
        ax.set_ylabel("fwd+bwd TFLOP/s")
        ax.set_title(f"{dtype}, head_dim {head_dim}, {'causal' if causal else 'non-causal'}")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def default_out_dir() -> Path:
    name = jax.devices()[0].device_kind if jax.devices()[0].platform == "gpu" else None
    return REPO_ROOT / "results" / f"attention-{hardware.gpu_slug(name)}"


def write_results(rows: list[dict], args: argparse.Namespace) -> dict[str, Path]:
    """Writes <name>.json (environment + rows), then <name>.md and <name>.png from it."""
    out = args.out or default_out_dir()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{args.name}.json"
    path.write_text(json.dumps({"environment": environment(args), "results": rows}, indent=1) + "\n")
    return {"json": path, **render_results(path)}


def render_results(path: Path) -> dict[str, Path]:
    """Writes the .md table and .png plot of a results JSON next to it, from
    the JSON alone (its recorded environment, not this machine's)."""
    data = json.loads(path.read_text())
    env, rows = data["environment"], data["results"]
    paths = {"md": path.with_suffix(".md"), "png": path.with_suffix(".png")}
    meta = "\n".join(f"- {k}: `{env[k]}`" for k in ("device", "jax", "torch", "triton", "git_commit", "command"))
    if env.get("stopped_after_cells") is not None:
        meta += f"\n- **stopped before the end: only the first {env['stopped_after_cells']} cell(s) were measured**"
    paths["md"].write_text(
        f"# Attention benchmark ({env['device']})\n\n{meta}\n- {env['timing']}\n- FLOPs: {env['flop_convention']}\n"
        f"- x/SDPA: time divided by the fastest PyTorch SDPA backend's time for the same cell (< 1 is faster)\n"
        f"- xbest: throughput ratio against the fastest of every SDPA backend and cuDNN through JAX "
        f"(fastest reference time / this time; >= 1 is at least as fast)\n\n"
        + render_table(rows, markdown=True) + "\n"
    )
    render_plot(rows, paths["png"])
    return paths


def _render_only(paths: list[Path]) -> int:
    for path in paths:
        try:
            written = render_results(path)
        except FileNotFoundError:
            print(f"bench_attention: --render {path}: no such file (pass a .json written by this benchmark)",
                  file=sys.stderr)
            return 2
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            print(f"bench_attention: --render {path}: not a results JSON of this benchmark ({exc!r}); "
                  "pass the .json it wrote", file=sys.stderr)
            return 2
        print(f"wrote {written['md']} and {written['png']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        return _render_only(args.render)
    platform_name = jax.devices()[0].platform
    if args.device == "gpu" and platform_name != "gpu":
        print(f"bench_attention: no GPU visible to JAX (platform {platform_name!r}); "
              "use --device cpu for a tiny smoke run", file=sys.stderr)
        return 2
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        rows = run_benchmark(args)
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(render_table(rows))
    for kind, path in write_results(rows, args).items():
        print(f"wrote {kind}: {path}")
    return 0 if args.stopped_after is None else 1


def _interrupt(signum, frame):
    """SIGTERM (e.g. a time limit) stops a sweep the way Ctrl-C does."""
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
