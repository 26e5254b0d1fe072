"""The report of `harness.bench_gemms`: which cuBLAS kernel each framework runs for the step's
GEMMs and what that choice costs, answer first, from the document alone."""

from __future__ import annotations

from harness import backends
from harness.common.tables import markdown_table
from harness.timing.gemms import summarize


def short(kernel: str | None) -> str:
    """A kernel name without its architecture prefix (`nvjet_sm90_`), the rest as cuBLAS names it."""
    if not kernel:
        return "-"
    return " + ".join(k.split("nvjet_sm90_", 1)[-1][:60] for k in kernel.split(" + "))


def _us(s: dict) -> str:
    return f"{s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f})" if s["n"] > 1 else f"{s['median']:.1f}"


def _pick(side: dict) -> str:
    return f"#{side['candidate']} `{short(side['kernel'])}`" if side.get("candidate") is not None \
        else f"`{short(side['kernel'])}`"


def answer(doc: dict) -> list[str]:
    """What the document says, first: whose choice each framework makes and what it costs a step."""
    s = summarize(doc)
    o, rows = doc["options"], s["rows"]
    if not rows:
        return ["No GEMM finished."]
    t, x, b = s["step_ms"]["mm"], s["step_ms"]["xla"], s["step_ms"]["best"]
    cell = f"`{o['model']}` at batch {o['batch']}, ctx {o['ctx']}, bf16"
    lines = [
        f"- torch's matmul ran the cuBLASLt heuristic's first candidate in {s['mm_first']} of {len(rows)} GEMMs; "
        f"XLA's autotuner chose another candidate in {s['xla_other']} of them"
        + (f", and compiled {s['xla_not_cublaslt']} to a fusion of its own rather than one cuBLASLt call"
           if s["xla_not_cublaslt"] else "")
        + ".",
        f"- Each kernel run back to back at the power cap: one training step's GEMMs of {cell} take {t:.1f} ms with "
        f"torch's kernels and {x:.1f} ms with XLA's choices ({x / t:.3f}x); the fastest candidate of each GEMM "
        f"would take {b:.1f} ms ({b / t:.3f}x).",
    ]
    gaps = sorted(rows, key=lambda r: (r["xla"]["median"] - r["mm"]["median"]) * r["per_step"])
    named = [f"{r['layer']} {r['pass']} {r['xla_over_mm']:.3f}x ({_pick(r['xla'])} against "
             f"`{short(r['mm']['kernel'])}`, {r['per_step']} a step)"
             for r in gaps[:3] if r["xla"]["median"] < r["mm"]["median"]]
    if named:
        lines.append("- Where XLA's choice gains most over the step: " + "; ".join(named) + ".")
    if stopped := doc.get("interrupted"):
        lines.append(f"- Interrupted: {stopped}.")
    return lines


def markdown(doc: dict) -> str:
    """The answer, then one row per GEMM, then how it was measured."""
    s = summarize(doc)
    o, env = doc["options"], doc.get("environment", {})
    header = ["GEMM", "pass", "m x n x k", "a step", "torch's kernel", "torch µs", "XLA's choice", "XLA µs",
              "XLA / torch", "fastest candidate", "fastest µs", "XLA's own call µs", "mJ a call: torch / XLA",
              "SM MHz: torch / XLA"]
    table = []
    for r in s["rows"]:
        t, x = r["mm"], r["xla"]
        mj = f"{t['mj']:.0f} / {x['mj']:.0f}" if t["mj"] is not None and x["mj"] is not None else "-"
        mhz = f"{t['mhz']:.0f} / {x['mhz']:.0f}" if t["mhz"] is not None and x["mhz"] is not None else "-"
        best = r["best"]
        table.append([r["layer"], r["pass"], " x ".join(map(str, r["shape"])), r["per_step"],
                      _pick(t), _us(t), _pick(x), _us(x), f"{r['xla_over_mm']:.3f}",
                      _pick(best) if best else "-", _us(best) if best else "-", _us(r["xla_call"]), mj, mhz])
    device = env.get("device") or env.get("name") or "the GPU"
    return "\n".join([
        "# Which cuBLAS kernels do torch and XLA run for the step's GEMMs, and what does the choice cost?", "",
        *answer(doc), "",
        *markdown_table(header, table), "",
        f"On {device}; {', '.join(f'{lib} {env[lib]}' for lib in backends.libraries() if lib in env)}, "
        f"cuBLASLt {env.get('cublaslt', '?')}. "
        f"Per GEMM, torch's `mm`, each candidate of the heuristic's list that ran ({o['requested']} asked for; `#` "
        "its index, as XLA's `selected_algorithm` counts) and XLA's own compiled call, each run back to back for "
        f"{o['seconds']} s untimed and {o['seconds']} s timed, in {o['rounds']} rounds of rotating order: medians "
        "and ranges over the rounds. \"XLA's choice\" is the candidate XLA's compiled program selected, timed here "
        "as every candidate is; where XLA compiled the dot to something else its own call's time stands there. "
        "torch's kernel is named as the profiler records it; `#` beside it is the candidate of that name. The "
        "step's totals weigh each GEMM by how often it runs in one step (`a step`): the linear layers of every "
        "block and the output head, forward and both gradients; the attention products are the fused "
        "kernel's and not here.",
        "",
    ])
