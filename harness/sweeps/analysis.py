"""A sweep's analysis: every table of its report as lists of dicts (rendering: `harness.sweeps.render`)."""

from __future__ import annotations

import dataclasses
import os
import re

from harness.common.cli import BACKENDS, DTYPES
from harness.config import PRESETS, get_config
from harness.sweeps.memory_model import predict
from harness.sweeps.records import FAILED, grid, load_records, load_sweep
from harness.timing.runner import PHASE_ORDER

DEFAULT_DEVICE_GB = 80


def _order(cell: dict) -> tuple:
    models = list(PRESETS)
    return (models.index(cell["model"]) if cell["model"] in models else len(models), cell["ctx"],
            DTYPES.index(cell["dtype"]), BACKENDS.index(cell["backend"]), cell["warmup"] or 0)


def sweep_cells(sweep: dict, records: list[dict]) -> list[dict]:
    """Every cell of the stored grid, in report order: its record, or status "not run"."""
    a = sweep["axes"]
    by_key = {r["key"]: r for r in records}
    cells = grid(a["models"], a["ctx"], a["backends"], a["dtypes"])
    if sweep.get("warmup_study"):
        cells += grid(a["models"][:1], a["ctx"][:1], a["backends"], a["dtypes"][:1], warmup_study=True)
    keys = {c.key for c in cells}
    out = [by_key.get(c.key) or {"key": c.key, "cell": dataclasses.asdict(c), "status": "not run",
                                  "reason": None, "result": None, "profile": None} for c in cells]
    out += [r for r in records if r["key"] not in keys]  # recorded under an earlier grid
    return sorted(out, key=lambda r: _order(r["cell"]))


def _phase(rec: dict, name: str) -> dict | None:
    return (rec.get("result") or {}).get("phases", {}).get(name) if rec["status"] == "ok" else None


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
        rows.append(row)
    return rows


def ratio_rows(rows: list[dict]) -> list[dict]:
    """JAX over torch median per model x ctx x dtype and phase; `fused_step` is JAX's fused
    step over torch's step. A value is None where either side has no number; `status`
    then says why ("OOM" or "failed", of either side)."""
    index = {(r["model"], r["ctx"], r["dtype"], r["backend"]): r for r in rows}
    out = []
    for (model, ctx, dtype, backend), t in index.items():
        j = index.get((model, ctx, dtype, "jax"))
        if backend != "torch" or j is None:
            continue
        row = {"model": model, "ctx": ctx, "dtype": dtype, "status": _pair_status(t, j)}
        for name in PHASE_ORDER:
            tp = t["step" if name == "fused_step" else name]
            jp = j[name]
            row[name] = jp["median_ms"] / tp["median_ms"] if tp and jp else None
        out.append(row)
    return out


def _pair_status(*rows: dict) -> str:
    statuses = {r["status"] for r in rows}
    if statuses == {"ok"}:
        return "ok"
    return "OOM" if "oom" in statuses else "not run" if statuses <= {"ok", "not run"} else "failed"


def bound_label(ratio: float | None) -> str | None:
    """Backward over forward: about 1x when memory-bound, toward 2x when compute-bound
    (backward does twice the forward's matmul FLOPs)."""
    if ratio is None:
        return None
    return "memory-bound" if ratio < 1.35 else "compute-bound" if ratio >= 1.7 else "in between"


def bound_notes(rows: list[dict]) -> list[dict]:
    """Per backend x dtype x model: the backward/forward ratio over context and the first
    context where it reaches 1.5x (None when it never does)."""
    series: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["bwd_over_fwd"] is not None:
            series.setdefault((r["backend"], r["dtype"], r["model"]), []).append(r)
    notes = []
    for (backend, dtype, model), rs in series.items():
        rs = sorted(rs, key=lambda r: r["ctx"])
        cross = next((r["ctx"] for r in rs if r["bwd_over_fwd"] >= 1.5), None)
        notes.append({"backend": backend, "dtype": dtype, "model": model,
                      "ratios": [(r["ctx"], r["bwd_over_fwd"]) for r in rs], "reaches_1_5x_at": cross,
                      "first": bound_label(rs[0]["bwd_over_fwd"]), "last": bound_label(rs[-1]["bwd_over_fwd"])})
    return notes


def device_memory_bytes(cells: list[dict], gb: float | None = None) -> tuple[int, str]:
    """Device memory for the fit prediction: `gb` (GiB) when given, else "<N>GB" in a run's
    device name (e.g. "NVIDIA H100 80GB HBM3"), else 80 GiB."""
    if gb is not None:
        return int(gb * 2**30), f"{gb:g} GiB (--device-memory-gb)"
    for rec in cells:
        name = ((rec.get("result") or {}).get("env") or {}).get("device") or ""
        m = re.search(r"(\d+)\s*GB", name)
        if m:
            return int(m.group(1)) * 2**30, f"{m.group(1)} GiB, from the device name {name!r}"
    return DEFAULT_DEVICE_GB * 2**30, f"{DEFAULT_DEVICE_GB} GiB (default; the device name does not say)"


def memory_rows(rows: list[dict], batch: int, attention: str, device_bytes: int) -> list[dict]:
    """Measured peak per phase beside the memory model's prediction, and whether the
    predicted step peak fits in `device_bytes`."""
    out = []
    for r in rows:
        pred = predict(get_config(r["model"], attention=attention), batch, r["ctx"], r["dtype"])["peaks"]
        row = {k: r[k] for k in ("model", "ctx", "backend", "dtype", "status", "key")}
        for name in ("forward", "backward", "optimizer", "step"):
            measured_phase = "fused_step" if name == "step" and r["backend"] == "jax" and r["fused_step"] else name
            measured = (r[measured_phase] or {}).get("peak_memory_bytes")
            row[name] = {"measured": measured, "predicted": pred[name],
                         "predicted_over_measured": pred[name] / measured if measured else None}
        row["predicted_fits"] = pred["step"] <= device_bytes
        out.append(row)
    return out


def speedup_rows(rows: list[dict]) -> list[dict]:
    """fp32 median over the other dtype's, per model x ctx x backend and phase."""
    index = {(r["model"], r["ctx"], r["backend"], r["dtype"]): r for r in rows}
    out = []
    for (model, ctx, backend, dtype), r in index.items():
        base = index.get((model, ctx, backend, "fp32"))
        if dtype == "fp32" or base is None:
            continue
        row = {"model": model, "ctx": ctx, "backend": backend, "dtype": dtype, "status": _pair_status(base, r)}
        for name in PHASE_ORDER:
            row[name] = base[name]["median_ms"] / r[name]["median_ms"] if base[name] and r[name] else None
        out.append(row)
    return out


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
    from harness.trace.breakdown import breakdown, load_profile
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


def analyze(out_dir: str, device_memory_gb: float | None = None) -> dict:
    """Everything the report shows, as data."""
    sweep = load_sweep(out_dir)
    cells = sweep_cells(sweep, load_records(out_dir))
    rows = phase_rows(cells)
    device_bytes, device_source = device_memory_bytes(cells, device_memory_gb)
    opts = sweep["options"]
    return {
        "sweep": sweep, "cells": cells, "phases": rows, "ratios": ratio_rows(rows), "bound_notes": bound_notes(rows),
        "memory": memory_rows(rows, opts["batch"], opts["attention"], device_bytes),
        "device_memory": {"bytes": device_bytes, "source": device_source},
        "speedups": speedup_rows(rows), "warmup": warmup_rows(cells),
        "kernels": kernel_rows(cells, out_dir) if opts["nsys"] else [],
        "failed": [c for c in cells if c["status"] in FAILED],
    }
