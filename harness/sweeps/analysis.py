"""A sweep's analysis: every table of its report as lists of dicts (rendering: `harness.reports.sweep`)."""

from __future__ import annotations

import dataclasses
import os
import re

import numpy as np

from harness import backends
from harness.common.documents import FAILED, Status
from harness.common.hardware import memory_mib
from harness.common.stats import NOISY_SPREAD
from harness.config import DTYPES, PRESETS, get_config
from harness.sweeps.records import grid, load_records, load_sweep, sweep_batches, sweep_data_parallel
from harness.sweeps.step_memory import predict
from harness.timing.legacy import per_device_run
from harness.timing.scaling import scaling_rows
from harness.timing.spec import PHASE_ORDER

DEFAULT_DEVICE_GB = 80
MIB = 2**20


def _index(values: tuple | list, value: object) -> int:
    return values.index(value) if value in values else len(values)


def _order(cell: dict) -> tuple:
    return (_index(list(PRESETS), cell["model"]), cell["ctx"], cell.get("batch") or 0, cell["data_parallel"],
            _index(DTYPES, cell["dtype"]), _index(backends.names(), cell["backend"]), cell["warmup"] or 0)


def sweep_cells(sweep: dict, records: list[dict]) -> list[dict]:
    """Every cell of the stored grid, in report order: its record, or status "not run".
    Each cell's "batch" and "data_parallel" are filled in (cells at the base batch and on
    one device carry none in their key)."""
    a = sweep["axes"]
    by_key = {r["key"]: r for r in records}
    base = sweep["options"]["batch"]
    cells = grid(a["models"], a["ctx"], a["backends"], a["dtypes"], batches=sweep_batches(sweep), base_batch=base,
                 data_parallel=sweep_data_parallel(sweep))
    if sweep.get("warmup_study"):
        cells += grid(a["models"][:1], a["ctx"][:1], a["backends"], a["dtypes"][:1], warmup_study=True)
    keys = {c.key for c in cells}
    out = [by_key.get(c.key) or {"key": c.key, "cell": dataclasses.asdict(c), "status": Status.NOT_RUN.value,
                                  "reason": None, "result": None, "profile": None} for c in cells]
    out += [r for r in records if r["key"] not in keys]  # recorded under an earlier grid
    out = [{**r, "result": per_device_run(r["result"]) if r.get("result") else r.get("result"),
            "cell": {**r["cell"], "batch": r["cell"].get("batch") or base,
                     "data_parallel": r["cell"].get("data_parallel") or 1}} for r in out]
    return sorted(out, key=lambda r: _order(r["cell"]))


def _phase(rec: dict, name: str) -> dict | None:
    """A finished cell's phase record, with the median SM clock over its measured calls and the
    MFU at that clock (`sm_mhz`, `mfu_at_clock`) where the run sampled its GPU's clock."""
    if rec["status"] != Status.OK:
        return None
    result = rec.get("result") or {}
    p = result.get("phases", {}).get(name)
    clock = ((result.get("gpu_clocks") or {}).get("phases") or {}).get(name) or {}
    if p is not None and clock.get("samples"):
        p = {**p, "sm_mhz": clock["sm_mhz"]["median"], "mfu_at_clock": clock.get("mfu_at_clock")}
    return p


def phase_rows(cells: list[dict]) -> list[dict]:
    """Per main cell: status and, per phase, median/std ms, TFLOP/s, MFU and peak bytes."""
    rows = []
    for rec in cells:
        if rec["cell"]["warmup"] is not None:
            continue
        row = {**rec["cell"], "key": rec["key"], "status": rec["status"], "reason": rec["reason"]}
        for name in PHASE_ORDER:
            row[name] = _phase(rec, name)
        fwd, bwd = row["forward"], row["backward"]
        row["bwd_over_fwd"] = bwd["median_ms"] / fwd["median_ms"] if fwd and bwd else None
        row["noisy"] = [name for name in ("forward", "backward") if row[name] and noisy(row[name])]
        rows.append(row)
    return rows


def noisy(phase: dict) -> bool:
    """Whether a phase's steps were timed on a busy machine: p90 beyond `NOISY_SPREAD` times
    p10, the compare report's rule (percentiles from the step times where a record predates them)."""
    p10, p90 = phase.get("p10_ms"), phase.get("p90_ms")
    if p10 is None and phase.get("times_ms"):
        p10, p90 = np.percentile(phase["times_ms"], [10, 90])
    return bool(p10 and p90 > NOISY_SPREAD * p10)


def ratio_rows(rows: list[dict]) -> list[dict]:
    """Each backend of another framework than the reference's (`backends.other_frameworks`:
    JAX) over the reference (torch), median per model x ctx x batch x dtype and phase;
    `fused_step` is its fused step over the reference's step; "backend" and "reference" name
    the two. A value is None where either side has no number; `status` then says why,
    naming the side ("OOM (jax)", "not run (torch)")."""
    index = {(r["model"], r["ctx"], r["batch"], r["data_parallel"], r["dtype"], r["backend"]): r for r in rows}
    under = backends.reference()
    out = []
    for over in backends.other_frameworks():
        for (model, ctx, batch, n, dtype, backend), t in index.items():
            j = index.get((model, ctx, batch, n, dtype, over))
            if backend != under or j is None:
                continue
            row = {"backend": over, "reference": under, "model": model, "ctx": ctx, "batch": batch,
                   "data_parallel": n, "dtype": dtype, "status": _pair_status({under: t, over: j})}
            for name in PHASE_ORDER:
                tp = t["step" if name == "fused_step" else name]
                jp = j[name]
                row[name] = jp["median_ms"] / tp["median_ms"] if tp and jp else None
            out.append(row)
    return out


STATUS_TEXT = {Status.OOM: "OOM", Status.ERROR: "failed", Status.CRASHED: "failed", Status.TIMEOUT: "failed",
               Status.NOT_RUN: "not run"}


def _pair_status(sides: dict[str, dict]) -> str:
    """"ok" when every side has numbers, else each side's own status with its name,
    e.g. "OOM (jax)" or "OOM (fp32); not run (bf16)" (only a cell that ran out of
    memory reads "OOM"), or the one status that every side shares."""
    by_status: dict[str, list[str]] = {}
    for name, r in sides.items():
        if r["status"] != Status.OK:
            by_status.setdefault(STATUS_TEXT.get(r["status"], r["status"]), []).append(name)
    if len(by_status) == 1 and len(next(iter(by_status.values()))) == len(sides):
        return next(iter(by_status))  # every side alike: "not run"
    return "; ".join(f"{text} ({', '.join(names)})" for text, names in by_status.items()) or Status.OK.value


def bound_label(ratio: float | None) -> str | None:
    """Backward over forward: about 1x when memory-bound, toward 2x when compute-bound
    (backward does twice the forward's matmul FLOPs)."""
    if ratio is None:
        return None
    return "memory-bound" if ratio < 1.35 else "compute-bound" if ratio >= 1.7 else "in between"


def regime(r: dict) -> str:
    """A phase row's backward/forward regime; judged on one device only, since under data
    parallelism the backward also holds the gradients' communication, whose growth with N
    says nothing of the compute."""
    if r["data_parallel"] > 1:
        return "not judged (N > 1: the backward holds the gradient communication)" if r["bwd_over_fwd"] else ""
    if r["bwd_over_fwd"] and r.get("noisy"):
        return f"not judged (noisy {' and '.join(r['noisy'])}: p90 above {NOISY_SPREAD:g}x p10)"
    return bound_label(r["bwd_over_fwd"]) or ""


def bound_notes(rows: list[dict]) -> list[dict]:
    """Per backend x dtype x model x batch: the backward/forward ratio over context, the
    contexts whose steps were noisy (`noisy`), and from the steady ones only: the first
    context where it reaches 1.5x (None when it never does) and the regimes at the first and
    last steady context (None where none is steady)."""
    series: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["bwd_over_fwd"] is not None and r["data_parallel"] == 1:  # see `regime`
            series.setdefault((r["backend"], r["dtype"], r["model"], r["batch"], r["data_parallel"]), []).append(r)
    notes = []
    for (backend, dtype, model, batch, n), rs in series.items():
        rs = sorted(rs, key=lambda r: r["ctx"])
        steady = [r for r in rs if not r.get("noisy")]
        cross = next((r["ctx"] for r in steady if r["bwd_over_fwd"] >= 1.5), None)
        ends = (steady[0], steady[-1]) if steady else (None, None)
        notes.append({"backend": backend, "dtype": dtype, "model": model, "batch": batch, "data_parallel": n,
                      "ratios": [(r["ctx"], r["bwd_over_fwd"]) for r in rs], "reaches_1_5x_at": cross,
                      "noisy": [r["ctx"] for r in rs if r.get("noisy")],
                      "first_ctx": ends[0] and ends[0]["ctx"], "last_ctx": ends[1] and ends[1]["ctx"],
                      "first": ends[0] and bound_label(ends[0]["bwd_over_fwd"]),
                      "last": ends[1] and bound_label(ends[1]["bwd_over_fwd"])})
    return notes


def device_memory_bytes(cells: list[dict], gb: float | None = None) -> tuple[int, str]:
    """Device memory for the fit prediction and where it came from: `gb` (GiB) when given,
    else the total memory a run recorded (nvidia-smi's memory.total), else the datasheet
    memory of the device name (`harness.common.hardware.GPUS`), else "<N>GB" in
    the name, else 80 GiB."""
    if gb is not None:
        return int(gb * 2**30), f"{gb:g} GiB (--device-memory-gb)"
    envs = [(rec.get("result") or {}).get("env") or {} for rec in cells]
    for env in envs:
        m = re.fullmatch(r"(\d+)\s*MiB", env.get("gpu_memory") or "")
        if m:
            return int(m.group(1)) * MIB, f"{int(m.group(1)) * MIB / 2**30:.1f} GiB, recorded by the run (nvidia-smi)"
    names = [env["device"] for env in envs if env.get("device")]
    for name in names:
        if mib := memory_mib(name):
            return mib * MIB, f"{mib * MIB / 2**30:.1f} GiB ({mib} MiB), the datasheet memory of {name!r}"
    for name in names:
        if m := re.search(r"(\d+)\s*GB", name):
            return int(m.group(1)) * 2**30, f"{m.group(1)} GiB, from the device name {name!r}"
    return DEFAULT_DEVICE_GB * 2**30, f"{DEFAULT_DEVICE_GB} GiB (default; no run recorded a known GPU)"


def measured_peak(r: dict, name: str) -> int | None:
    """A phase row's measured peak bytes; for "step", the step's own peak (JAX: the fused
    step's), else the largest phase peak (torch resets its peak before each phase, so the
    step's peak is the largest of its phases')."""
    if name != "step":
        return (r[name] or {}).get("peak_memory_bytes")
    own = (r["fused_step"] or r["step"] or {}).get("peak_memory_bytes")
    phases = [measured_peak(r, p) for p in ("forward", "backward", "optimizer")]
    return own or (max(phases) if all(phases) else None)


def memory_rows(rows: list[dict], attention: str, device_bytes: int) -> list[dict]:
    """Measured peak per phase beside the memory model's prediction (at each row's batch),
    and whether the predicted step peak fits in `device_bytes`."""
    out = []
    for r in rows:
        pred = predict(get_config(r["model"], attention=attention), r["batch"], r["ctx"], r["dtype"])["peaks"]
        row = {k: r[k] for k in ("model", "ctx", "batch", "data_parallel", "backend", "dtype", "status", "key")}
        for name in ("forward", "backward", "optimizer", "step"):
            measured = measured_peak(r, name)
            row[name] = {"measured": measured, "predicted": pred[name],
                         "predicted_over_measured": pred[name] / measured if measured else None}
        row["predicted_fits"] = pred["step"] <= device_bytes
        out.append(row)
    return out


def speedup_rows(rows: list[dict]) -> list[dict]:
    """fp32 median over the other dtype's, per model x ctx x batch x backend and phase."""
    index = {(r["model"], r["ctx"], r["batch"], r["data_parallel"], r["backend"], r["dtype"]): r for r in rows}
    out = []
    for (model, ctx, batch, n, backend, dtype), r in index.items():
        base = index.get((model, ctx, batch, n, backend, "fp32"))
        if dtype == "fp32" or base is None:
            continue
        row = {"model": model, "ctx": ctx, "batch": batch, "data_parallel": n, "backend": backend, "dtype": dtype,
               "status": _pair_status({"fp32": base, dtype: r})}
        for name in PHASE_ORDER:
            row[name] = base[name]["median_ms"] / r[name]["median_ms"] if base[name] and r[name] else None
        out.append(row)
    return out


def best_rows(rows: list[dict]) -> list[dict]:
    """Per backend x dtype, the cell (model, ctx, batch, devices) whose whole training step
    (the step, or JAX's fused step where it is faster) reaches the highest MFU per device;
    where no cell has an MFU (a device without a datasheet peak, e.g. CPU), the highest
    TFLOP/s per device, which ranks cells of one device and dtype alike."""
    best: dict[tuple, dict] = {}
    rank = lambda b: (b["mfu"] is not None, b["mfu"] or 0.0, b["tflops"])  # noqa: E731
    for r in rows:
        for phase in ("step", "fused_step"):
            p = r[phase]
            if not p or not p.get("tflops"):
                continue
            key = (r["backend"], r["dtype"])
            cand = {"backend": r["backend"], "dtype": r["dtype"], "model": r["model"], "ctx": r["ctx"],
                    "batch": r["batch"], "data_parallel": r["data_parallel"], "phase": phase, "tflops": p["tflops"],
                    "mfu": p.get("mfu"), "tokens_per_s": p.get("tokens_per_s"), "median_ms": p["median_ms"],
                    "key": r["key"], "sm_mhz": p.get("sm_mhz"), "mfu_at_clock": p.get("mfu_at_clock")}
            if key not in best or rank(cand) > rank(best[key]):
                best[key] = cand
    return sorted(best.values(), key=lambda b: (_index(backends.names(), b["backend"]), _index(DTYPES, b["dtype"])))


def warmup_rows(cells: list[dict]) -> list[dict]:
    """Warm-up study cells: mean, std and first measured step of `step` (and `fused_step`)."""
    rows = []
    for rec in cells:
        c = rec["cell"]
        if c["warmup"] is None:
            continue
        row = {**c, "status": rec["status"], "reason": rec["reason"]}
        for name in ("step", "fused_step"):
            p = _phase(rec, name)
            row[name] = {"mean_ms": p["mean_ms"], "std_ms": p["std_ms"], "first_ms": p["times_ms"][0],
                         "median_ms": p["median_ms"]} if p else None
        rows.append(row)
    return rows


def kernel_rows(cells: list[dict], out_dir: str) -> list[dict]:
    """With --nsys: per cell the top forward kernel and category shares of forward and step,
    from `harness.breakdown`; `error` says why a profile could not be read."""
    from harness.trace.analyses.breakdown import breakdown, load_profile
    from harness.trace.profile import ProfileError

    rows = []
    for rec in cells:
        if not rec.get("profile"):
            continue
        row = {**rec["cell"], "key": rec["key"], "error": None}
        try:
            bd = breakdown(load_profile(os.path.join(out_dir, rec["profile"]), rec["cell"]["backend"]))
        except ProfileError as exc:
            rows.append({**row, "error": str(exc)})
            continue
        for name in ("forward", "step"):
            p = bd.phases.get(name) or (bd.phases.get("fused_step") if name == "step" else None)
            row[name] = None if p is None else {
                "phase": p.phase, "gpu_ms": p.gpu_ns_per_step / 1e6,
                "top_kernel": p.kernels[0].name if p.kernels else None,
                "top_share": p.kernels[0].share if p.kernels else None,
                "categories": {c: ns / p.gpu_ns_per_step for c,
                               ns in p.categories.items()} if p.gpu_ns_per_step else {}}
        rows.append(row)
    return rows


def scaling(cells: list[dict]) -> list[dict]:
    """The scaling table's rows (`harness.reports.scaling`) over the main cells that finished;
    empty unless some ran on more than one device."""
    main = [c for c in cells if c["cell"]["warmup"] is None and c["status"] == Status.OK and c.get("result")]
    if not any(c["cell"]["data_parallel"] > 1 for c in main):
        return []
    return scaling_rows([c["result"] for c in main])


def analyze(out_dir: str, device_memory_gb: float | None = None) -> dict:
    """Everything the report shows, as data."""
    sweep = load_sweep(out_dir)
    cells = sweep_cells(sweep, load_records(out_dir))
    rows = phase_rows(cells)
    device_bytes, device_source = device_memory_bytes(cells, device_memory_gb)
    opts = sweep["options"]
    return {
        "sweep": sweep, "cells": cells, "phases": rows, "ratios": ratio_rows(rows), "bound_notes": bound_notes(rows),
        "batches": sorted({r["batch"] for r in rows}), "best": best_rows(rows),
        "data_parallel": sorted({r["data_parallel"] for r in rows}), "scaling": scaling(cells),
        "memory": memory_rows(rows, opts["attention"], device_bytes),
        "device_memory": {"bytes": device_bytes, "source": device_source},
        "speedups": speedup_rows(rows), "warmup": warmup_rows(cells),
        "kernels": kernel_rows(cells, out_dir) if opts["nsys"] else [],
        "failed": [c for c in cells if c["status"] in FAILED],
    }
