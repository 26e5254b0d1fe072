"""The generated blocks of the project's pages (README.md, docs/*.md): figures are rendered from
the result documents, never typed.

A page marks a block with two HTML comments, which markdown renders as nothing:

    <!-- generated: main-job main-job/large-ctx256-bf16-h200-three-way -->
    ...rendered text, rewritten by `python -m harness.regenerate`...
    <!-- end generated -->

The first word after "generated:" names the renderer (`RENDERERS`), the rest its argument: for
`main-job`, a compare folder under the results root (its path below the root), whose
summary.json the block is built from; for `why`, such a folder run under nsys (each pair of its
backends decomposed as `harness.diff` does, the two largest parts of each gap); for `answer`, a
generated report (.md) whose opening answer the block quotes; for `parity`, a folder of
`harness.parity` documents, each one's verdict; for `exposed`,
several such folders, space-separated (data-parallel runs profiled under nsys: their exposed
communication per step); for
`breakdown`, compare folders profiled under nsys (where each step's GPU time goes), and for
`mfu-points` the same (each step's MFU and the points each kind of time costs it); `provenance`
takes none and renders, in a results folder's README.md, what that folder's documents record
of their machine, versions, trees and commands (`provenance_block`); `hopper-targets` takes a
folder of `harness.bench_attention` runs and renders the Hopper kernel's verdicts on them
(`harness.attention.targets.hopper_answer`); `runs` takes a folder of `harness.run` documents
and renders one row per run (`run_table`), and `clocks` the same folder as the GPU clock each
run held over its step (`clock_table`); `best-mfu` takes folders of `harness.run` documents and
renders the best median MFU per backend over their cells (`best_cells`); `tune-speedups` takes a
folder of `harness.tune_attention` searches and renders each candidate against its default per
shape (`tune_speedups`). `render_page` gives the
page with every block rendered again; text outside the markers is left as it is.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path

from harness import backends
from harness.common.documents import CompareDocument, RunDocument, whole_step
from harness.common.hardware import peak_tflops
from harness.common.tables import markdown_table
from harness.config import config_from_document
from harness.diffs.throughput import MFU_PARTS, gemm_flops, profiled_mfu_points
from harness.reports.best_cells import best_mfu_text
from harness.reports.compare_answer import compare_findings
from harness.reports.page_answers import answer, parity, why
from harness.reports.provenance_block import provenance, tree_label
from harness.timing.clocks import time_clock_r, watts_text
from harness.trace.kernels import Category

# Markers stand at the start of their own line (a marker quoted in prose or a code span is none).
BLOCK = re.compile(r"^(<!-- generated: (?P<spec>[^>]*?) -->\n)(?P<body>.*?)^(<!-- end generated -->)$", re.S | re.M)
OPEN = re.compile(r"^<!-- generated:", re.M)


class BlockError(Exception):
    """A page's block that cannot be rendered; the message names the page and the block."""


def _step_row(label: str, p: dict, first_s: float | None) -> list[str]:
    spread = f"{p['p10_ms']:.1f}-{p['p90_ms']:.1f}" if p.get("p10_ms") is not None else "-"
    mfu = f"{100 * p['mfu']:.1f}%" if p.get("mfu") else "-"
    return [label, f"{p['median_ms']:.1f}", spread, str(p.get("n", len(p.get("times_ms") or []))), mfu,
            f"{first_s:.1f}" if first_s else "-"]


def _command(summary: dict) -> str:
    """The compare command as run, less its `--out` (a folder of the machine it ran on)."""
    words = shlex.split(str((summary.get("env") or {}).get("command", "")))
    kept = [w for i, w in enumerate(words) if w != "--out" and (i == 0 or words[i - 1] != "--out")]
    return " ".join(kept)


def _versions(runs: dict[str, RunDocument]) -> str:
    """The frameworks each run recorded (`backends.libraries`: torch, jax), once each, in run order."""
    seen: dict[str, str] = {}
    for r in runs.values():
        env = r.get("env") or {}
        for lib in backends.libraries():
            if env.get(lib):
                seen.setdefault(lib, f"{lib} {env[lib]}")
    return ", ".join(seen.values())


def main_job(folder: Path, root: Path) -> str:
    """The main job's table: per backend the step (median, p10-p90, measured steps), MFU and time
    to first step, JAX's fused and split steps on rows of their own; the answer's speed finding
    above it; the machine, versions, commit and command under it."""
    summary = json.loads((folder / "summary.json").read_text())
    runs = CompareDocument.from_dict(summary, str(folder / "summary.json")).runs
    rows = []
    for backend, r in runs.items():
        if not r.ok:
            rows.append([backend, "failed", "-", "-", "-", "-"])
            continue
        first = (r.get("first_step") or {}).get("time_to_first_step_ms")
        first_s = first / 1e3 if first else None
        phases = r.phases
        if "fused_step" in phases:
            rows.append(_step_row(f"{backend}, fused step", phases["fused_step"], first_s))
            rows.append(_step_row(f"{backend}, split step", phases["step"], None))
        else:
            rows.append(_step_row(backend, phases["step"], first_s))
    header = ["backend", "step median (ms)", "p10-p90 (ms)", "measured steps", "MFU", "time to first step (s)"]
    speed = [f.text for f in compare_findings(summary) if f.topic == "speed"]
    commits = sorted({tree_label(str((r.get("env") or {}).get("git_commit"))) for r in runs.values()})
    o = summary["options"]
    lines = [*(f"{text}." for text in speed[:1]), "",
             *markdown_table(header, rows), "",
             f"`{o['model']}`, ctx {o['ctx']}, batch {o['batch']}, {o['dtype']}, {o['attention']} attention, "
             f"{o['steps']} measured steps after {o['warmup']} warm-up; {summary.get('device')}, "
             f"{_versions(runs)}; tree {', '.join(commits)}; `{_command(summary)}` "
             f"(`results/{folder.relative_to(root).as_posix()}/`)."]
    return "\n".join(lines) + "\n"


def exposed(folders: list[Path], root: Path) -> str:
    """Exposed communication per step of data-parallel compare folders: per folder and backend,
    the step, its communication and the part of it no compute hides (the mean over devices,
    and the most any device waits), against the step's median; the tree and the XLA_FLAGS each
    run recorded, since the folders differ by them."""
    rows = []
    for folder in folders:
        summary = json.loads((folder / "summary.json").read_text())
        runs = CompareDocument.from_dict(summary, str(folder / "summary.json")).runs
        for backend, per in (summary.get("overlap") or {}).items():
            env = (runs[backend].get("env") or {}) if backend in runs else {}
            flags = (env.get("settings") or {}).get("XLA_FLAGS", "")
            step = whole_step(per.get("per_step", {}))
            p = per["per_step"][step]
            rows.append([f"`{folder.name}`", backend, (summary.get("data_parallel") or {}).get("parallel", "-"),
                         f"`{flags}`" if flags else "-", tree_label(str(env.get("git_commit") or "-")), step,
                         f"{p['step_ms']:.1f}", f"{p['communication_ms']:.1f}",
                         f"{p['exposed_ms']:.2f} ({p['exposed_max_ms']:.2f})",
                         f"{100 * p['exposed_share_of_step']:.1f}%"])
    header = ["folder", "backend", "--parallel", "XLA_FLAGS", "tree", "step", "step ms", "communication ms/step",
              "exposed ms/step (most)", "exposed share of the step"]
    return "\n".join(markdown_table(header, rows)) + "\n"


# The columns of the breakdown block: kernel categories summed.
BREAKDOWN_COLUMNS = {
    "GEMM": (Category.GEMM,), "attention": (Category.ATTENTION,), "elementwise": (Category.ELEMENTWISE,),
    "reduction, norm, softmax": (Category.REDUCTION, Category.NORM, Category.SOFTMAX),
    "copies": (Category.MEMORY,), "optimizer": (Category.OPTIMIZER,),
}


def _profiled_steps(folders: list[Path]):
    """Per compare folder profiled under nsys and backend: (the folder's name in a table, the
    backend's label, the step timed (JAX's fused step where it has one), its kernel figures
    per step from kernels.json, the kernels.json entry and the run document it profiled)."""
    unique = len({f.name for f in folders}) == len(folders)  # else each folder by its parent too
    for folder in folders:
        if not (folder / "kernels.json").is_file():
            raise ValueError(f"{folder} has no kernels.json: profile it (`harness.compare ... --nsys`)")
        summary = json.loads((folder / "summary.json").read_text())
        runs = CompareDocument.from_dict(summary, str(folder / "summary.json")).runs
        for entry in json.loads((folder / "kernels.json").read_text()):
            label, phases = entry["label"], entry["phases"]
            phase = whole_step(phases)
            name = folder.name if unique else f"{folder.parent.name}/{folder.name}"
            yield name, label, phase, phases[phase], entry, runs[label]


def breakdown(folders: list[Path], root: Path) -> str:
    """Where each profiled step's GPU time goes, side by side: per compare folder profiled under
    nsys (its kernels.json) and backend, the step timed (JAX's fused step where it has one) under
    the profiler (the mean over the measured steps, as the kernel report's per-step figures are),
    the share of it the GPU computes, the kernel time per step of each category
    group (its share of the GPU time), and the GEMMs' TFLOP/s: the matmul FLOPs the harness
    counts for the step, less the attention products a fused-attention kernel ran, over the
    GEMM kernels' time, against the device's dense peak for the dtype."""
    rows = []
    for name, label, phase, p, _, run in _profiled_steps(folders):
        gpu, cats = p["gpu_ns_per_step"], p["categories"]
        o, device = run.get("options") or {}, (run.get("env") or {}).get("device")
        config = config_from_document(run.get("config"))[0]
        flops = gemm_flops(config, o["batch"], o["ctx"], phase, bool(cats.get(Category.ATTENTION.value)))
        peak = peak_tflops(device, o.get("dtype"))
        cells = []
        for names in BREAKDOWN_COLUMNS.values():
            ns = sum(cats.get(n.value, 0.0) for n in names)
            cells.append(f"{ns / 1e6:.1f} ({100 * ns / gpu:.1f}%)" if ns else "-")
        rest = gpu - sum(cats.get(n.value, 0.0) for names in BREAKDOWN_COLUMNS.values() for n in names)
        tflops = flops / cats[Category.GEMM.value] / 1e3 if cats.get(Category.GEMM.value) else None
        gemm = "-" if tflops is None else f"{tflops:.0f}" + (f" ({100 * tflops / peak:.0f}%)" if peak else "")
        rows.append([f"`{name}`", label, phase, f"{p['range_ns_per_step'] / 1e6:.1f}",
                     f"{100 * p['busy_ns_per_step'] / p['range_ns_per_step']:.1f}%", *cells,
                     f"{rest / 1e6:.1f}" if rest > 0.05 * 1e6 else "-", gemm])
    header = ["folder", "backend", "step", "step ms (mean, profiled)", "GPU busy",
              *(f"{c} ms" for c in BREAKDOWN_COLUMNS), "other ms", "GEMM TFLOP/s (of peak)"]
    return "\n".join(markdown_table(header, rows)) + "\n"


def mfu_points_table(folders: list[Path], root: Path) -> str:
    """Where each profiled step's MFU points go (`mfu_points`), side by side: per compare folder
    profiled under nsys and backend, the step's MFU over its profiled time (the mean step) and
    the points of 100 that each kind of time costs it, which sum to 100 with the MFU."""
    rows = []
    for name, label, phase, p, entry, run in _profiled_steps(folders):
        if "busy_ns_per_step" not in p:
            raise ValueError(f"{name}: its kernels.json has no GPU busy time per step (written before reports "
                             f"kept it): profile the step again")
        if not (pts := profiled_mfu_points(entry, run)):
            raise ValueError(f"{name}: its {label} run records no model, batch or device with a known dense peak: "
                             f"no MFU to split")
        rows.append([f"`{name}`", label, phase, *(f"{round(pts[k], 1) + 0.0:.1f}" for k in MFU_PARTS)])  # no -0.0
    header = ["folder", "backend", "step", "MFU % (profiled step)", *(f"{k} (points)" for k in MFU_PARTS[1:])]
    return "\n".join(markdown_table(header, rows)) + "\n"


def hopper_targets(folder: Path, root: Path) -> str:
    """The Hopper kernel's verdicts (`hopper_answer`) over the `harness.bench_attention` runs in
    `folder`, read in name order (a cell measured in several: the last), and the runs named."""
    from harness.attention.targets import check_hopper, hopper_answer, latest_cells

    runs = {p.name: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}
    runs = {name: doc["results"] for name, doc in runs.items() if isinstance(doc, dict) and "results" in doc}
    if not runs:
        raise ValueError(f"{folder} holds no harness.bench_attention run")
    records = check_hopper(latest_cells(list(runs.values())))
    return "\n".join([*hopper_answer(records), "", f"From {', '.join(f'`{n}`' for n in runs)}; the table per cell "
                      "is `python -m harness.attention_targets --targets hopper` on them."]) + "\n"


def _run_documents(folder: Path) -> dict[str, RunDocument]:
    """The `harness.run` documents in `folder` by file name, in name order; ValueError for none."""
    docs = {}
    for path in sorted(folder.glob("*.json")):
        doc = json.loads(path.read_text())
        if isinstance(doc, dict) and "status" in doc and "options" in doc:
            docs[path.name] = RunDocument.from_dict(doc, str(path))
    if not docs:
        raise ValueError(f"{folder} holds no harness.run document")
    return docs


def run_table(folder: Path, root: Path) -> str:
    """One row per `harness.run` document in `folder`, in name order: backend, batch, the step
    timed (JAX's fused step where the run has one), its median and p10-p90 over the measured
    steps, MFU and peak device memory (the step's, else the largest of its phases'); a failed run
    with its reason."""
    docs = _run_documents(folder)
    header = ["run", "backend", "batch", "step", "median (ms)", "p10-p90 (ms)", "measured steps", "MFU",
              "peak memory (GiB)"]
    rows = []
    for name, run in docs.items():
        label = [f"`{name}`", str(run.backend), str(run.options.get("batch", "-"))]
        if not run.ok:
            rows.append([*label, f"{run.status.value}: {run.message}", "-", "-", "-", "-", "-"])
            continue
        step = whole_step(run.phases)
        p = run.phases[step]
        # torch records a peak per phase (reset before each), so its step's is the largest of them
        peak = p.get("peak_memory_bytes") or max((q.get("peak_memory_bytes") or 0 for q in run.phases.values()),
                                                 default=0)
        rows.append([*label, step, *_step_row("", p, None)[1:5], f"{peak / 2**30:.1f}" if peak else "-"])
    return "\n".join(markdown_table(header, rows)) + "\n"


def clock_table(folder: Path, root: Path) -> str:
    """One row per `harness.run` document in `folder` that sampled its GPU's clock, by backend
    and batch: backend, batch, the step (JAX's fused step where the run has one), its median and
    MFU, the SM clock over its measured calls (median, min-max), the median power, the share
    of samples at the power cap, MFU against the peak at the median clock, and Pearson's r
    between the calls' times and mean clocks (`harness.timing.clocks`)."""
    header = ["run", "backend", "batch", "step", "median (ms)", "MFU", "SM clock MHz: median (min-max)",
              "power", "at the power cap", "MFU at that clock", "r (time, clock)"]
    rows = []
    docs = _run_documents(folder)
    for name, run in sorted(docs.items(), key=lambda kv: (str(kv[1].backend), kv[1].options.get("batch", 0), kv[0])):
        clocks = run.get("gpu_clocks") or {}
        step = whole_step(run.phases)
        rec = (clocks.get("phases") or {}).get(step) or {}
        if not run.ok or not rec.get("samples"):
            continue
        p, mhz, watts = run.phases[step], rec["sm_mhz"], rec.get("power_w")
        r = time_clock_r(p.get("times_ms") or [], rec["call_mhz"])
        rows.append([f"`{name}`", str(run.backend), str(run.options.get("batch", "-")), step,
                     f"{p['median_ms']:.1f}", f"{p['mfu']:.1%}" if p.get("mfu") else "-",
                     f"{mhz['median']:.0f} ({mhz['min']}-{mhz['max']})", watts_text(watts) if watts else "-",
                     f"{rec['power_capped']:.0%}", f"{rec['mfu_at_clock']:.1%}" if rec.get("mfu_at_clock") else "-",
                     "-" if r is None else f"{r:.2f}"])
    if not rows:
        raise ValueError(f"{folder} holds no finished harness.run document with a sampled GPU clock")
    return "\n".join(markdown_table(header, rows)) + "\n"


def _with_range(row: dict) -> str:
    """A search row's median and, where it recorded them (older searches did not), its repeats' range."""
    spread = row.get("ms_spread")
    return f"{row['ms']:.3f}" + (f" ({spread[0]:.3f}-{spread[1]:.3f})" if spread else "")


def tune_speedups(folder: Path, root: Path) -> str:
    """Every candidate of the `harness.tune_attention` searches in `folder` (their .jsonl, in
    name order) against its default, one row per shape: both medians with their repeats' range
    (the default's the faster of its two measurements), the speed-up, and whether it lies beyond
    the noise (`tune.beyond_noise`)."""
    from harness.attention.catalog import cell_key
    from harness.attention.tune import AGAIN, beyond_noise, read_rows  # imports JAX: only for this block

    header = ["search", "pass", "B x H x seq x D", "causal", "candidate", "default ms (range)",
              "candidate ms (range)", "speed-up", "beyond the noise"]
    out = []
    for path in sorted(folder.glob("*.jsonl")):
        rows = [r for r in read_rows(path)[0] if r["status"] == "ok"]
        faster = beyond_noise(rows)
        for r in rows:
            if r["candidate"] in ("default", AGAIN):
                continue
            same = [d for d in rows if d["candidate"] in ("default", AGAIN) and d["pass"] == r["pass"]
                    and cell_key(d) == cell_key(r)]
            if not same:
                continue
            d = min(same, key=lambda x: x["ms"])
            out.append([f"`{path.stem}`", r["pass"], f"{r['batch']} x {r['heads']} x {r['seq']} x {r['head_dim']}",
                        "yes" if r["causal"] else "no", r["candidate"], _with_range(d), _with_range(r),
                        f"{d['ms'] / r['ms']:.3f}x", "yes" if any(r is f for f in faster) else "no"])
    if not out:
        raise ValueError(f"{folder} holds no search with a candidate measured beside its default")
    return "\n".join(markdown_table(header, out)) + "\n"


RENDERERS: dict[str, Callable[[Path, Path], str]] = {"main-job": main_job, "why": why, "answer": answer,
                                                     "parity": parity,
                                                     "hopper-targets": hopper_targets, "runs": run_table,
                                                     "clocks": clock_table, "tune-speedups": tune_speedups}
# What a renderer's folder must hold (compare folders: their summary.json).
HOLDS = {"hopper-targets": ("*.json", "harness.bench_attention runs"), "runs": ("*.json", "harness.run documents"),
         "clocks": ("*.json", "harness.run documents"), "best-mfu": ("*.json", "harness.run documents"),
         "parity": ("*.json", "harness.parity documents"),
         "tune-speedups": ("*.jsonl", "harness.tune_attention searches")}
# Renderers over several compare folders: the block names them all, space-separated.
MULTI: dict[str, Callable[[list[Path], Path], str]] = {"exposed": exposed, "breakdown": breakdown,
                                                        "mfu-points": mfu_points_table, "best-mfu": best_mfu_text}


def render_page(text: str, name: str, root: Path) -> str:
    """`text` (the page `name`) with each generated block rendered again from the documents under
    `root` (the results folder); raises BlockError naming the page and block that cannot be."""
    if len(OPEN.findall(text)) != len(BLOCK.findall(text)):
        raise BlockError(f"{name}: a '<!-- generated: ... -->' marker without its '<!-- end generated -->'")

    def render(m: re.Match) -> str:
        kind, _, arg = m["spec"].strip().partition(" ")
        if kind == "provenance":  # the page's own folder: no argument
            return m.group(1) + provenance(Path(name).parent, BLOCK.sub("", text)) + m.group(4)
        if kind not in RENDERERS and kind not in MULTI:
            raise BlockError(f"{name}: block '{kind}' is not one of {', '.join([*RENDERERS, *MULTI])}, provenance")
        folders = [root / a for a in arg.split()]
        if not folders:
            raise BlockError(f"{name}: block '{m['spec']}' names no compare folder under {root}")
        if kind in RENDERERS and len(folders) > 1:
            raise BlockError(f"{name}: block '{m['spec']}' names {len(folders)} folders; '{kind}' takes one")
        pattern, what = HOLDS.get(kind, ("summary.json", "compare folder"))
        if kind == "answer":  # a report, not a folder
            if not (folders[0].is_file() and folders[0].suffix == ".md"):
                raise BlockError(f"{name}: block '{m['spec']}': {folders[0]} is no report (.md) under {root}")
        elif missing := [f for f in folders if not any(f.glob(pattern))]:
            raise BlockError(f"{name}: block '{m['spec']}': {missing[0]} holds no {what} under {root}")
        try:
            body = RENDERERS[kind](folders[0], root) if kind in RENDERERS else MULTI[kind](folders, root)
        except (KeyError, TypeError, ValueError) as exc:
            raise BlockError(f"{name}: block '{m['spec']}': {', '.join(str(f) for f in folders)} "
                             f"cannot be rendered ({type(exc).__name__}: {exc})") from None
        return m.group(1) + body + m.group(4)

    return BLOCK.sub(render, text)


def pages(repo: Path, root: Path | None = None) -> list[Path]:
    """The pages whose blocks are generated: README.md and docs/**/*.md in `repo`, and the
    README.md files under the results folder `root`, those that hold one."""
    found = [repo / "README.md", *sorted((repo / "docs").rglob("*.md")),
             *(sorted(root.rglob("README.md")) if root is not None else [])]
    return [p for p in found if p.is_file() and OPEN.search(p.read_text())]
