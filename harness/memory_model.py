"""Predicted peak device memory of one torch training step, per phase (`harness.sweeps.step_memory`);
with --compiled, XLA's own account of each JAX program.

    python -m harness.memory_model                                   # every preset x ctx 128..1024
    python -m harness.memory_model --model large --ctx 256 --batch 4 --dtype bf16
    python -m harness.memory_model --model large --ctx 1024 --batch 16 --dtype bf16 --attention fused --compiled

With one model and one context it prints the state, activation and per-phase peak
predictions in GiB: parameters, gradients, AdamW state, what autograd saves per layer,
and the logits. With several (or none given: every preset, ctx 128, 256, 512, 1024) it
prints the predicted step peak of each model x context, and with --device-memory-gb
whether it fits. The sweep report sets the same predictions beside measured peaks.

--compiled (one model, one context) compiles JAX's programs for --device from abstract
arguments, runs nothing, and prints per program what XLA's memory analysis says: arguments,
outputs, temporaries, outputs aliased to donated arguments, and the peak (on the CPU, whose
XLA reports a peak without the temporaries, the upper bound that adds them, said as such).
The forward of the split step hands its outputs, `jax.vjp`'s residuals, to the backward, a
second program; the fused step keeps what the backward needs inside one program, so the two
differ most here.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence

from harness import backends
from harness.cli.dialect import (
    add_attention,
    add_batch,
    add_ctx,
    add_device,
    add_device_memory,
    add_dtype,
    add_model,
    fail,
    make_parser,
    parse_args,
    select_platform,
)
from harness.common.errors import UsageError
from harness.common.tables import markdown_table
from harness.config import PRESETS, get_config
from harness.sweeps.step_memory import predict

GIB = 2**30
TABLE_CTX = (128, 256, 512, 1024)


def build_parser() -> argparse.ArgumentParser:
    p = make_parser("harness.memory_model", __doc__)
    add_model(p, many=True, default=None, without="None: every preset")
    add_ctx(p, many=True, without="None: 128,256,512,1024")
    add_batch(p)
    add_dtype(p)
    add_attention(p)
    add_device_memory(p, "device memory to test the step peaks against (None: no fit verdict)")
    p.add_argument("--compiled", action="store_true",
                   help="XLA's memory analysis of each JAX program, compiled for --device from abstract arguments "
                        "(nothing runs; one --model and one --ctx)")
    add_device(p)
    return p


PROGRAMS = {"forward": "split step: forward (its outputs are the residuals the backward takes)",
            "backward": "split step: backward", "optimizer": "split step: optimizer",
            "fused_step": "fused step (forward, backward and AdamW in one program)"}


def compiled_memory(model: str, ctx: int, batch: int, dtype: str, attention: str, device: str) -> dict:
    """XLA's memory analysis of each JAX program of this step (`JaxSession.memory_analysis`),
    by phase, in bytes; the session holds the weights and optimizer state on `device`."""
    from harness.backends.jax.session import JaxSession
    from harness.timing.tokens import make_tokens

    config = get_config(model, attention=attention)
    session = JaxSession(config, make_tokens(config.vocab_size, batch, ctx, 0), device=device, dtype=dtype, seed=0)
    return session.memory_analysis()


def format_compiled(sizes: dict) -> str:
    """A table of each program's sizes in GiB, then the answer: what the split step hands from
    its forward to its backward against the fused step's peak."""
    rows = [[PROGRAMS.get(phase, phase), *(f"{s[k] / GIB:.3f}" for k in ("argument", "output", "temp", "alias",
                                                                           "peak"))]
            for phase, s in sizes.items()]
    table = markdown_table(["program", "arguments GiB", "outputs GiB", "temporaries GiB", "aliased GiB",
                            "peak GiB"], rows)
    fused = sizes["fused_step"]
    at_most = "no more than " if fused.get("peak_bound") else ""
    answer = (f"the split step's forward hands its backward {sizes['forward']['output'] / GIB:.3f} GiB of residuals; "
              f"the fused step peaks at {at_most}{fused['peak'] / GIB:.3f} GiB")
    bound = [phase for phase, s in sizes.items() if s.get("peak_bound")]
    which = "every program's peak" if len(bound) == len(sizes) else f"the peak of {', '.join(bound)}"
    note = ([f"{which}: arguments + outputs + temporaries - aliased, an upper bound (XLA reported no peak that "
             "counts the program's temporaries)"] if bound else [])
    return "\n".join([answer, "", *table, *([""] + note if note else [])])


def format_prediction(pred: dict) -> str:
    """One line per term and per phase peak, in GiB."""
    lines = [f"{'state':<12} {name:<22} {n / GIB:10.3f}" for name, n in pred["state"].items()]
    lines += [f"{'saved':<12} {name:<22} {n / GIB:10.3f}" for name, n in pred["activations"].items()]
    lines += [f"{'peak':<12} {name:<22} {n / GIB:10.3f}" for name, n in pred["peaks"].items()]
    return "\n".join([f"{'kind':<12} {'term':<22} {'GiB':>10}", *lines])


def format_step_table(models: Sequence[str], ctxs: Sequence[int], batch: int, dtype: str, attention: str,
                      device_gib: float | None) -> str:
    """Predicted step peak (GiB) per model x context; with `device_gib`, "(no)" where it does not fit."""
    rows = []
    for model in models:
        config = get_config(model, attention=attention)
        cells = []
        for ctx in ctxs:
            step = predict(config, batch, ctx, dtype)["peaks"]["step"] / GIB
            cells.append(f"{step:.3g}" + (" (no)" if device_gib is not None and step > device_gib else ""))
        rows.append([model, *cells])
    return "\n".join(markdown_table(["model", *(f"ctx {c}" for c in ctxs)], rows))


# A step peak past this many GiB (1 PiB) fits no machine: the sizes are a slip, and the
# table would only print 16-digit numbers.
MAX_PREDICTED_GIB = 2**20


def size_problem(models: Sequence[str], ctxs: Sequence[int], batch: int, dtype: str, attention: str) -> str | None:
    """Why these sizes are beyond any device (one line naming the options), or None."""
    for model in models:
        config = get_config(model, attention=attention)
        for ctx in ctxs:
            step = predict(config, batch, ctx, dtype)["peaks"]["step"] / GIB
            if step > MAX_PREDICTED_GIB:
                return (f"--model {model} --ctx {ctx} --batch {batch}: the step would need {step:.3g} GiB, beyond "
                        f"any device ({MAX_PREDICTED_GIB} GiB); lower --ctx or --batch")
    return None


def machine_memory(device: str) -> tuple[int, str] | None:
    """Bytes one device of this machine holds, and in words: the host's RAM on CPU; on cuda
    the memory of the smallest GPU this process may use ($CUDA_VISIBLE_DEVICES), as
    nvidia-smi reports it (read without starting CUDA here, which would take memory from the
    runs); None where it cannot be read."""
    if device == "cpu":
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            return None
        return total, f"this machine's {total / GIB:.1f} GiB of host RAM"
    from harness.common.results import nvidia_smi_all

    sizes = [int(m.group(1)) * 2**20 for gpu in nvidia_smi_all()
             if (m := re.fullmatch(r"(\d+)\s*MiB", gpu.get("gpu_memory", "")))]
    if not sizes:
        return None
    total = min(sizes)
    return total, (f"the GPU's {total / GIB:.1f} GiB" if len(sizes) == 1 else
                   f"the smallest of the {len(sizes)} GPUs' {total / GIB:.1f} GiB")


def step_need(config, batch: int, ctx: int, dtype: str, mode: str) -> int:
    """Predicted peak bytes of one step in `mode`: the step peak in train; without AdamW's
    moments in forward-backward; in forward, a lower bound (parameters and float32 logits)."""
    pred = predict(config, batch, ctx, dtype)
    state = pred["state"]
    if mode == "train":
        return pred["peaks"]["step"]
    if mode == "forward-backward":
        return max(pred["peaks"]["forward"], pred["peaks"]["backward"]) - state["adamw_m"] - state["adamw_v"]
    return state["parameters"] + batch * ctx * config.vocab_size * 4


def fit_problem(model: str, ctx: int, batch: int, dtype: str, attention: str, mode: str, device: str,
                data_parallel: int = 1, memory: tuple[int, str] | None = None,
                backend_names: Sequence[str] = ()) -> str | None:
    """Why a run of these sizes would run out of memory on this machine (one line naming
    --batch and the largest batch that fits), or None: refused before any work, where the
    memory model's prediction (a lower bound for fused attention) exceeds the memory of a
    device (`memory`, default `machine_memory`; on CPU the ranks of --data-parallel share the
    host's RAM).

    The model is of torch's autograd graph. On a GPU it guards runs with a backend it applies
    to (`Backend.memory_model`: torch's) among `backend_names` (none named: any run). JAX's
    programs keep what XLA plans, which can be far less (its fused norm saves one float32 copy
    of the stream per norm, not two), and a JAX run out of device memory says so itself. On
    the CPU every run is guarded: the host's RAM runs out for the whole machine."""
    if device != "cpu" and backend_names and not any(backends.get(n).memory_model for n in backend_names):
        return None
    memory = memory or machine_memory(device)
    if memory is None:
        return None
    total, what = memory
    config = get_config(model, attention=attention)
    sharing = data_parallel if device == "cpu" else 1

    def need(b: int) -> int:
        return step_need(config, b, ctx, dtype, mode) * sharing

    if need(batch) <= total:
        return None
    lo, hi = 0, batch  # need(lo) fits (or lo is 0), need(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if need(mid) <= total else (lo, mid)
    fix = (f"use --batch {lo} or less" if lo else
           f"no --batch fits at --model {model} --ctx {ctx}: lower --ctx or use a smaller --model")
    ranks = f", {sharing} ranks of --data-parallel" if sharing > 1 else ""
    return (f"--batch {batch}: the step would need about {need(batch) / GIB:.3g} GiB (harness.memory_model's "
            f"prediction{ranks}), more than {what}; {fix}")


def fit_line(pred: dict, device_gib: float) -> str:
    """Whether the largest phase peak fits in `device_gib`, and by how much."""
    phase, peak = max(pred["peaks"].items(), key=lambda item: item[1])
    verdict = "fits" if peak / GIB <= device_gib else "does not fit"
    return f"{verdict} in {device_gib:g} GiB: largest peak {peak / GIB:.3f} GiB ({phase})"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    models, ctxs = args.model or list(PRESETS), args.ctx or list(TABLE_CTX)
    if problem := size_problem(models, ctxs, args.batch, args.dtype, args.attention):
        return fail(problem)
    if args.device is not None and not args.compiled:
        return fail(f"--device {args.device}: picks where --compiled compiles JAX's programs; add --compiled, "
                    "or drop --device for the prediction")
    if args.compiled:
        if len(models) != 1 or len(ctxs) != 1:
            return fail("--compiled: compiles one step; name one --model and one --ctx")
        if args.device_memory_gb is not None:
            return fail("--device-memory-gb: tests the prediction, not --compiled, whose table gives each "
                        "program's peak; drop one of them")
        try:
            select_platform(args)
        except UsageError as exc:
            return fail(str(exc))
        sizes = compiled_memory(models[0], ctxs[0], args.batch, args.dtype, args.attention, args.device)
        print(f"{models[0]} ctx {ctxs[0]} batch {args.batch} {args.dtype} attention {args.attention}: "
              f"JAX's programs compiled for {args.device}, XLA's memory analysis")
        print(format_compiled(sizes))
        return 0
    if len(models) == 1 and len(ctxs) == 1:
        config = get_config(models[0], attention=args.attention)
        pred = predict(config, args.batch, ctxs[0], args.dtype)
        print(f"{models[0]} ctx {ctxs[0]} batch {args.batch} {args.dtype} attention {args.attention}")
        print(format_prediction(pred))
        if args.device_memory_gb is not None:
            print(fit_line(pred, args.device_memory_gb))
        return 0
    fits = "" if args.device_memory_gb is None else f"; (no): over {args.device_memory_gb:g} GiB"
    print(f"predicted step peak (GiB), batch {args.batch}, {args.dtype}, {args.attention} attention{fits}; "
          "one model and one --ctx for the terms behind a peak")
    print(format_step_table(models, ctxs, args.batch, args.dtype, args.attention, args.device_memory_gb))
    return 0


if __name__ == "__main__":
    sys.exit(main())
