"""Tile-size search for our attention kernels: which block sizes are fastest, per shape and pass
(the library behind `python -m harness.tune_attention`).

Each candidate is the backend's default block sizes with a few fields
changed (CANDIDATES). Forward candidates are timed on the forward pass, and
backward candidates on the backward alone (from saved residuals), with the
timing of the benchmark (`harness.attention.interleaved`) (median of repeats of back-to-back
launches, after warm-up). Every candidate's output is compared with the
default's on the same inputs; a difference beyond the dtype's tolerance marks
it `mismatch`, and a candidate that does not compile or does not fit is
recorded as failed, never dropped. Rows are appended to a JSON-lines file as
they are measured, so a run cut short keeps what it measured; candidates run
in the outer loop, so the ones measured cover every shape.

`rank` condenses the rows: per pass and head_dim, each candidate's geometric
mean speed-up over the default across the shapes where both ran, and its
worst shape. Rendering is separate.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path

from harness.attention.catalog import PASS_FLOP_FACTOR, cell_key, fwd_flops
from harness.attention.impls import block_sizes_for, build_jax
from harness.attention.interleaved import failure_status, release_memory, time_ms
from harness.attention.options import TuneOptions
from harness.common.answer import Finding, answer_markdown
from harness.common.tables import markdown_table

# Relative difference (max |candidate - default| / max |default|) allowed per dtype.
TOLERANCE = {"bfloat16": 2e-2, "float16": 5e-3, "float32": 5e-3}

# The backward fields that the head_dim 128 default sets for its fused
# kernel with dQ split by columns, at the values every other schedule needs.
UNSPLIT_BWD = {"dq_split": False, "dq_lag": False}

# Overrides of the backend's default block sizes, per (backend, pass). The
# default ({}) is always measured first. Fields a pass does not use are left
# alone, so a forward candidate times the same backward and vice versa.
CANDIDATES: dict[tuple[str, str], list[dict]] = {
    ("mosaic", "fwd"): [
        {},
        {"num_stages": 2},
        {"num_stages": 4},
        {"overlap": False, "fwd_stagger": False},
        {"overlap": True},
        {"overlap": True, "num_stages": 2},
        {"overlap": True, "num_stages": 4},
        {"overlap": True, "fwd_stagger": True},
        {"fwd_stagger": False},
        {"consumers": 3},
        {"consumers": 3, "num_stages": 2},
        {"consumers": 3, "num_stages": 4},
        {"group_heads": False},
        {"group_heads": True},
        {"kv_multicast": True},
        {"kv_multicast": False},
    ],
    ("mosaic", "bwd"): [
        {},
        {"block_k_dq": 128},
        {"block_q_dkv": 128},
        {"block_k_dq": 128, "block_q_dkv": 128},
        {"fused_bwd": False, **UNSPLIT_BWD},
        {"fused_bwd": False, **UNSPLIT_BWD, "block_q_dkv": 128},
        {"fused_bwd": True, **UNSPLIT_BWD},
        {"fused_bwd": True, **UNSPLIT_BWD, "block_q_dkv": 64},
        {"fused_bwd": True, **UNSPLIT_BWD, "block_q_dkv": 128},
        {"fused_bwd": True, "dq_split": True},
        {"mask_tile": False},
        {"mask_tile": True},
        {"dq_lag": False},
        {"dq_lag": True},
        {"lse_early": False},
        {"lse_early": True},
    ],
    ("triton", "fwd"): [
        {},
        {"block_q": 64},
        {"block_k": 128},
        {"num_warps_fwd": 4},
        {"num_stages_fwd": 2},
    ],
    ("triton", "bwd"): [
        {},
        {"block_q_dkv": 32},
        {"block_k_dkv": 128},
        {"block_q_dq": 128},
        {"num_warps_bwd": 8},
        {"num_stages_bwd": 2},
    ],
}
IMPL = {"mosaic": "pallas_mosaic", "triton": "pallas"}
AGAIN = "default (again)"


def _label(overrides: dict) -> str:
    return "default" if not overrides else " ".join(f"{k}={v}" for k, v in overrides.items())


def _rel_diff(got, want) -> float:
    import numpy as np

    diffs, scales = [], []
    for a, b in zip(got, want):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        diffs.append(float(np.max(np.abs(a - b))))
        scales.append(float(np.max(np.abs(b))))
    return max(diffs) / max(max(scales), 1e-6)


def measure(backend: str, pass_: str, overrides: dict, cell: dict, reference, args: TuneOptions) -> tuple:
    """(row, outputs): times one pass of one candidate on one cell."""
    row = {"backend": backend, "pass": pass_, "candidate": _label(overrides), "overrides": overrides, **cell,
           "status": "ok"}
    outputs = None
    try:
        blocks = block_sizes_for(backend, cell["head_dim"], overrides, cell["seq"], cell["causal"])
        row["block_sizes"] = dataclasses.asdict(blocks)
        thunks, sync, timer = build_jax(IMPL[backend], cell, args.device, block_sizes=blocks)
        outputs = _as_tuple(sync(thunks[pass_]()))
        median, lo, hi = time_ms(thunks[pass_], sync, timer, args)
        row.update(ms=median, ms_spread=[lo, hi],
                   tflops=fwd_flops(cell) * PASS_FLOP_FACTOR[pass_] / (median * 1e-3) / 1e12)
        if reference is not None:
            row["rel_diff_vs_default"] = _rel_diff(outputs, reference)
            if row["rel_diff_vs_default"] > TOLERANCE[cell["dtype"]]:
                row["status"] = f"mismatch: differs from the default by {row['rel_diff_vs_default']:.2e}"
    except Exception as exc:  # noqa: BLE001 -- every failure becomes a marked row
        row["status"] = failure_status(exc, [])
        outputs = None
    finally:
        thunks = None
        release_memory()
    return row, outputs


def _as_tuple(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def run(args: TuneOptions, out_path: Path) -> list[dict]:
    """Measures every candidate of `args.kernel` on every cell, appending each row to out_path
    (its "backend" field names the kernel family, as in the rows recorded so far)."""
    import jax

    rows, todo = [], args.cells()
    device = jax.devices("cpu")[0] if args.device == "cpu" else jax.devices()[0]
    with jax.default_device(device), out_path.open("a") as sink:
        for pass_ in args.passes:
            references: dict[int, tuple] = {}
            seen: dict[int, list] = {}
            # The default runs first and again last: the baseline is the faster
            # of its two medians, so drift during the search (clocks, a busy
            # host) cannot make candidates look faster than they are.
            candidates = [c for c in CANDIDATES[(args.kernel, pass_)] if not c or args.only is None or args.only in c]
            for n, overrides in enumerate([*candidates, {}]):
                again = n > 0 and not overrides
                for i, cell in enumerate(todo):
                    if not again and _repeats(args.kernel, cell, overrides, seen.setdefault(i, [])):
                        continue
                    start = time.perf_counter()
                    row, outputs = measure(args.kernel, pass_, overrides, cell, references.get(i), args)
                    if again:
                        row["candidate"] = AGAIN
                    if not overrides and outputs is not None:
                        references[i] = outputs
                    row["wall_s"] = round(time.perf_counter() - start, 2)
                    rows.append(row)
                    sink.write(json.dumps(row) + "\n")
                    sink.flush()
                    print(_progress(row), file=sys.stderr, flush=True)
    return rows


def _repeats(backend: str, cell: dict, overrides: dict, seen: list) -> bool:
    """True if these overrides give block sizes already measured on this cell, as the kernels
    run them there (e.g. a candidate that sets the cell's default value, or K/V multicast on a
    causal cell, which runs without it)."""
    try:
        blocks = block_sizes_for(backend, cell["head_dim"], overrides, cell["seq"], cell["causal"])
    except ValueError:
        return False
    if hasattr(blocks, "as_run"):
        blocks = blocks.as_run(cell["seq"], cell["causal"])
    if blocks in seen:
        return True
    seen.append(blocks)
    return False


def _progress(row: dict) -> str:
    shape = f"{row['batch']}x{row['seq']}x{row['heads']}x{row['head_dim']} causal={row['causal']!s:5s}"
    got = f"{row['ms']:.3f} ms" if row["status"] == "ok" else row["status"]
    return f"{row['pass']} {shape} {row['candidate']:40s} {got} ({row['wall_s']} s)"


def _baseline(rows: list[dict]) -> dict[tuple, float]:
    """Per (pass, cell): the fastest median of the default's measurements."""
    out: dict[tuple, float] = {}
    for r in rows:
        if r["candidate"] in ("default", AGAIN) and r["status"] == "ok":
            key = (r["pass"], cell_key(r))
            out[key] = min(out.get(key, math.inf), r["ms"])
    return out


def rank(rows: list[dict]) -> list[dict]:
    """Per (pass, head_dim, candidate): geometric-mean speed-up over the
    default (its fastest median / candidate time) over the cells where both ran,
    the worst cell's speed-up, and how many cells ran / failed. Sorted best
    first within each (pass, head_dim)."""
    default = _baseline(rows)
    groups: dict[tuple, dict] = {}
    for r in rows:
        g = groups.setdefault((r["pass"], r["head_dim"], r["candidate"]),
                              {"pass": r["pass"], "head_dim": r["head_dim"], "candidate": r["candidate"],
                               "speedups": [], "failed": 0})
        base = default.get((r["pass"], cell_key(r)))
        if r["status"] != "ok":
            g["failed"] += 1
        elif base is not None:
            g["speedups"].append(base / r["ms"])
    out = []
    for g in groups.values():
        s = g.pop("speedups")
        g.update(cells=len(s), geomean=math.exp(statistics.fmean(map(math.log, s))) if s else None,
                 worst=min(s) if s else None, best=max(s) if s else None)
        out.append(g)
    return sorted(out, key=lambda g: (g["pass"], g["head_dim"], -(g["geomean"] or 0)))


def best_per_cell(rows: list[dict]) -> list[dict]:
    """Per (pass, cell): the fastest candidate that ran and matched, with its
    speed-up over the default."""
    default = _baseline(rows)
    best: dict[tuple, dict] = {}
    for r in rows:
        key = (r["pass"], cell_key(r))
        if r["status"] == "ok" and (key not in best or r["ms"] < best[key]["ms"]):
            best[key] = r
    out = []
    for (pass_, cell), r in sorted(best.items(), key=lambda x: (x[0][0], x[0][1][3], x[0][1][2], not x[0][1][5])):
        base = default.get((pass_, cell))
        out.append({"pass": pass_, "seq": r["seq"], "head_dim": r["head_dim"], "causal": r["causal"],
                    "batch": r["batch"], "heads": r["heads"], "candidate": r["candidate"], "ms": r["ms"],
                    "tflops": r["tflops"], "default_ms": base, "speedup": base / r["ms"] if base else None})
    return out


def beyond_noise(rows: list[dict]) -> list[dict]:
    """The measurements faster than the default beyond the noise: the candidate's range of
    repeats below the range of each of the default's measurements on that cell."""
    defaults: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["candidate"] in ("default", AGAIN) and r["status"] == "ok":
            defaults.setdefault((r["pass"], cell_key(r)), []).append(r)
    return [r for r in rows if r["candidate"] not in ("default", AGAIN) and r["status"] == "ok"
            and (ds := defaults.get((r["pass"], cell_key(r)))) and r.get("ms_spread")
            and all(d.get("ms_spread") and r["ms_spread"][1] < d["ms_spread"][0] for d in ds)]


def _f(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


TUNE_RULES = ("a candidate's speed-up is the default's time over its own, per shape; the best candidate per pass "
              "and head dim has the highest geometric mean over the shapes where both ran; faster beyond the "
              "noise where the candidate's range of repeats lies below the range of each of the default's "
              "measurements")


def tune_findings(rows: list[dict]) -> list[Finding]:
    """Per pass and head dim, the best candidate and what it gives over the default; failures."""
    findings, seen = [], set()
    base = _baseline(rows)
    ahead_of_default = sorted(beyond_noise(rows), key=lambda r: r["ms"] / base[(r["pass"], cell_key(r))])
    for g in rank(rows):  # best first within each (pass, head_dim)
        key = (g["pass"], g["head_dim"])
        if key in seen or g["geomean"] is None:
            continue
        seen.add(key)
        over = (f"geomean over {g['cells']} shapes; worst shape {g['worst']:.3f}x, best {g['best']:.3f}x"
                if g["cells"] > 1 else "one shape")
        what = ("the default is the best candidate" if g["candidate"] in ("default", AGAIN) else
                f"best: {g['candidate']}, {g['geomean']:.3f}x the default's speed ({over})")
        findings.append(Finding("tune", f"{g['pass']}, head dim {g['head_dim']}: {what}", "Candidates ranked"))
        ahead = [f"{r['candidate']} at {r['batch']}x{r['seq']}x{r['heads']}x{r['head_dim']}"
                 f"{' causal' if r['causal'] else ''} ({base[(r['pass'], cell_key(r))] / r['ms']:.3f}x)"
                 for r in ahead_of_default if (r["pass"], r["head_dim"]) == key]
        findings.append(Finding("noise", f"{g['pass']}, head dim {g['head_dim']}: faster than the default beyond "
                                f"the noise: {'; '.join(ahead[:4]) + (' ...' if len(ahead) > 4 else '') or 'none'}",
                                "Fastest candidate per shape"))
    failed = [r for r in rows if r["status"] != "ok"]
    if failed:
        findings.append(Finding("failed", f"{len(failed)} of {len(rows)} measurements did not run or did not match",
                                "Not measured"))
    return findings


def tune_markdown(rows: list[dict], env: dict | None = None) -> str:
    lines = ["# Block-size search", "", *answer_markdown(tune_findings(rows), TUNE_RULES)]
    if env:
        lines += [f"- {k}: `{env[k]}`" for k in ("device", "jax", "git_commit", "command") if k in env] + [""]
    lines += ["Speed-up = default time / candidate time (> 1 is faster), the default's time being the faster of "
              "its measurements (it runs first and last); geomean over the shapes where both ran.",
              "", "## Candidates ranked", "",
              *markdown_table(["pass", "head_dim", "candidate", "geomean", "worst", "best", "shapes", "failed"], [])]
    for g in rank(rows):
        lines.append(f"| {g['pass']} | {g['head_dim']} | {g['candidate']} | {_f(g['geomean'], '.3f')} | "
                     f"{_f(g['worst'], '.3f')} | {_f(g['best'], '.3f')} | {g['cells']} | {g['failed']} |")
    lines += ["", "## Fastest candidate per shape", "",
              *markdown_table(["pass", "B", "H", "seq", "D", "causal", "fastest", "ms", "TFLOP/s", "default ms",
                               "speed-up"], [])]
    for b in best_per_cell(rows):
        lines.append(f"| {b['pass']} | {b['batch']} | {b['heads']} | {b['seq']} | {b['head_dim']} | "
                     f"{'yes' if b['causal'] else 'no'} | {b['candidate']} | {b['ms']:.3f} | {b['tflops']:.0f} | "
                     f"{_f(b['default_ms'], '.3f')} | {_f(b['speedup'], '.3f')} |")
    failed = [r for r in rows if r["status"] != "ok"]
    if failed:
        lines += ["", "## Not measured", "", *markdown_table(["pass", "seq", "D", "causal", "candidate", "status"], [])]
        lines += [f"| {r['pass']} | {r['seq']} | {r['head_dim']} | {'yes' if r['causal'] else 'no'} | "
                  f"{r['candidate']} | {r['status'][:120]} |" for r in failed]
    return "\n".join(lines) + "\n"


def read_rows(path: Path) -> tuple[list[dict], dict | None]:
    env, rows = None, []
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            if "environment" in record:
                env = record["environment"]
            else:
                rows.append(record)
    return rows, env
