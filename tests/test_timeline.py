"""timeline.json.gz: the profiles on one Chrome trace, read back with the project's own
Chrome-trace reader and checked against the report's figures, steps aligned."""

from __future__ import annotations

import gzip
import json
import sqlite3
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from test_report_html import check_page

from harness import compare, diff, report
from harness.cli.trace_options import step_selection
from harness.trace.kernels import CATEGORY_COLORS
from harness.trace.sources.kineto import load_torch_trace
from harness.trace.timeline import CNAMES, RESERVED

DATA = Path(__file__).parent / "data"
TORCH = DATA / "torch_small_train" / "torch_small_train.sqlite.gz"
JAX = DATA / "jax_small_train" / "jax_small_train.sqlite.gz"
FALLBACK = DATA / "torch_fallback" / "torch_tiny_fallback.json.gz"
LABELS = ("torch", "jax", "fallback")


def _report(out: Path, *extra: str) -> tuple[dict, list[dict]]:
    argv = [str(TORCH), str(JAX), str(FALLBACK), *sum((["--label", x] for x in LABELS), []), "--out", str(out),
            "--no-plot", "--timeline", *extra]
    assert report.main(argv) == 0
    with gzip.open(out / "timeline.json.gz", "rt") as f:
        return json.load(f), json.loads((out / "kernels.json").read_text())


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, list[dict]]:
    out = tmp_path_factory.mktemp("timeline")
    return out, *_report(out)


def _processes(doc: dict, folder: Path) -> dict[str, object]:
    """Process name -> that process's events read back by load_torch_trace (a Profile)."""
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    out = {}
    for pid, name in names.items():
        events = [e for e in doc["traceEvents"] if e["pid"] == pid]
        if any(e.get("cat") == "kernel" for e in events):
            path = folder / f"process-{pid}.json"
            path.write_text(json.dumps({"traceEvents": events}))
            out[name] = load_torch_trace(path)
    return out


def _inside(profile, name: str) -> int:
    """ns of the kernels whose execution lies inside a range called `name` (independent of the builder)."""
    total = 0
    start, end = profile.kernels.start, profile.kernels.end
    for r in profile.ranges:
        if r.name == name:
            total += int((end - start)[(start >= r.start) & (end <= r.end)].sum())
    return total


def test_kernels_read_back_sum_to_the_report(written) -> None:
    out, doc, bds = written
    processes = _processes(doc, out)
    assert set(processes) == {"torch", "jax", "jax fused_step", "fallback"}
    checked = 0
    for bd in bds:
        for key, phase in bd["phases"].items():
            process = f"{bd['label']} {phase['root']}" if phase["root"] == "fused_step" else bd["label"]
            got = _inside(processes[process], key.split("/")[-1]) / phase["steps"]
            assert got == pytest.approx(phase["gpu_ns_per_step"], rel=1e-12), (bd["label"], key)
            checked += 1
    assert checked == 4 + 5 + 4  # torch and the fallback: step and 3 phases; JAX adds fused_step


def test_report_page(written) -> None:
    out = written[0]
    assert check_page(out, "kernels.md").svgs == 0  # --no-plot: no kernels.png, no plot on the page


def test_steps_aligned(written) -> None:
    out, doc, _ = written
    starts = np.array(doc["otherData"]["step_starts_us"]) * 1000
    assert len(starts) == 3 and starts[0] == 0 and np.all(np.diff(starts) > 0)
    for name, profile in _processes(doc, out).items():
        root = "fused_step" if name.endswith("fused_step") else "step"
        steps = [r for r in profile.ranges if r.name == root]
        assert [r.start for r in steps] == starts.tolist(), name
        assert all(a.end <= b.start for a, b in zip(steps, steps[1:])), name  # no overlap


def test_kernel_args_colours_and_flows(written) -> None:
    _, doc, _ = written
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    for e in kernels:
        assert e["args"]["color"] == next(c for k, c in CATEGORY_COLORS.items() if k.value == e["args"]["category"])
        assert e["cname"] == next(n for k, n in CNAMES.items() if k.value == e["args"]["category"])
    assert len(set(CNAMES.values())) == len(CNAMES) and set(CNAMES.values()) <= set(RESERVED)
    launches = {e["bind_id"]: e for e in doc["traceEvents"] if e.get("flow_out")}
    bound = [e for e in kernels if e.get("flow_in")]
    # nsys records every kernel's launch (CUPTI; some copies' too); torch.profiler's kernels are
    # joined to their launches by correlation id where the launch lies inside the trace
    nsys = {e["pid"] for e in doc["traceEvents"] if e.get("name") == "process_name" and e["args"]["name"] != "fallback"}
    assert all(e.get("flow_in") for e in kernels if e["pid"] in nsys and not e["name"].startswith("[CUDA mem"))
    assert len(bound) > 1000 and len(launches) == len(bound)
    assert any(e["pid"] not in nsys for e in bound)
    for e in bound:
        launch = launches[e["bind_id"]]
        assert launch["pid"] == e["pid"] and launch["ts"] <= e["ts"]
        assert launch["args"]["correlation"] == e["args"]["correlation"]


def test_grid_and_block_from_the_export(written, tmp_path: Path) -> None:
    _, doc, _ = written
    plain = tmp_path / "torch.sqlite"
    plain.write_bytes(gzip.decompress(TORCH.read_bytes()))
    db = sqlite3.connect(plain)
    rows = {c: (f"{gx}x{gy}x{gz}", f"{bx}x{by}x{bz}") for c, gx, gy, gz, bx, by, bz in db.execute(
        "SELECT correlationId, gridX, gridY, gridZ, blockX, blockY, blockZ FROM CUPTI_ACTIVITY_KIND_KERNEL")}
    db.close()
    pid = next(e["pid"] for e in doc["traceEvents"] if e["name"] == "process_name" and e["args"]["name"] == "torch")
    kernels = [e["args"] for e in doc["traceEvents"]
               if e.get("cat") == "kernel" and e["pid"] == pid and not e["name"].startswith("[CUDA mem")]
    assert len(kernels) > 1000 and all((a["grid"], a["block"]) == rows[a["correlation"]] for a in kernels)


def test_step_selection_parses() -> None:
    assert step_selection("0,2-3") == (0, 2, 3) and step_selection("3,1") == (1, 3) and step_selection("all") == "all"


def test_all_steps_lays_out_the_whole_profile(tmp_path: Path) -> None:
    assert report.main([str(FALLBACK), "--out", str(tmp_path), "--no-plot", "--timeline", "--timeline-steps", "all"]) == 0
    with gzip.open(tmp_path / "timeline.json.gz", "rt") as f:
        doc = json.load(f)
    profile = load_torch_trace(FALLBACK)
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    assert len(kernels) == len(profile.kernels)  # warm-up and first-step work included
    assert min(e["ts"] for e in doc["traceEvents"] if "ts" in e) == 0
    steps = sorted(e["ts"] for e in doc["traceEvents"] if e.get("cat") == "user_annotation" and e["name"] == "step")
    warmup = [e for e in doc["traceEvents"] if e.get("cat") == "user_annotation" and e["name"] == "warmup"]
    first_measured = min(t for t in steps if all(t >= w["ts"] + w["dur"] for w in warmup))
    assert first_measured == doc["otherData"]["step_starts_us"][0] > 0


def test_diff_timeline_marks_each_phase(tmp_path: Path) -> None:
    out = tmp_path / "diff"
    assert diff.main([str(TORCH), str(JAX), "--out", str(out), "--timeline", "--timeline-steps", "1-2"]) == 0
    with gzip.open(out / "timeline.json.gz", "rt") as f:
        events = json.load(f)["traceEvents"]
    steps = defaultdict(set)
    for e in events:
        if e.get("cat") == "kernel":
            steps[e["pid"]].add(e["args"]["step"])
    assert list(steps.values()) == [{1, 2}] * 3  # A, B's split step, B's fused step
    check_page(out, "diff.md")
    marks = {e["args"]["phase"]: e for e in events if e.get("cat") == "annotation"}
    assert set(marks) == {"forward", "backward", "optimizer", "step", "fused_step"}
    diff_doc = json.loads((out / "diff.json").read_text())
    for phase in diff_doc["phases"]:
        top = max(phase["parts"], key=lambda p: abs(p["b_ms"] - p["a_ms"]))
        assert marks[phase["phase"]]["name"].startswith(f"{phase['phase']}: {top['name']} ")
    forward = min((e for e in events if e.get("cat") == "user_annotation" and e["pid"] == 2 and e["name"] == "forward"),
                  key=lambda e: e["ts"])  # B's forward in the first laid-out step
    assert (marks["forward"]["ts"], marks["forward"]["dur"]) == (forward["ts"], forward["dur"])


def test_diff_timeline_steps_beyond_the_profiles_are_refused(tmp_path: Path, capsys) -> None:
    """As report and compare do: a step index the profiles do not hold is refused in one line
    before anything is written (it wrote an empty timeline and exited 0)."""
    out = tmp_path / "diff"
    assert diff.main([str(TORCH), str(JAX), "--out", str(out), "--timeline", "--timeline-steps", "1,50"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: --timeline-steps 50: the profiles hold measured steps 0-")
    assert not out.exists()


@pytest.mark.parametrize(("module", "argv", "needle"), [
    (compare, ["--model", "tiny", "--ctx", "64", "--device", "cpu", "--timeline"], "--nsys or --profile"),
    (report, [str(TORCH), "--timeline-steps", "0"], "add --timeline"),
    (report, [str(TORCH), "--timeline", "--timeline-steps", "2-1"], "0,2-3"),
    (diff, [str(TORCH), str(JAX), "--timeline"], "--out"),
    (diff, [str(DATA / "sweep"), str(JAX), "--timeline", "--out", "x"], None),
])
def test_bad_timeline_input_is_one_line(module, argv, needle, capsys, tmp_path) -> None:
    try:
        code = module.main(argv)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    if needle:
        assert needle in err


DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("fixture", ["user_loops/torch_loop.sqlite.gz", "user_loops/flax_loop.sqlite.gz",
                                     "user_loops/compiled_loop.sqlite.gz",
                                     "user_profiles/torch_profiler/rank0.json.gz"])
def test_the_timeline_counts_the_kernels_the_breakdown_counts(fixture: str) -> None:
    """Users' profiles (steps named step0..., torch.profiler's ProfilerSteps with the last
    one closed mid-iteration): the kernels a timeline marks measured are those the breakdown
    counts, all its kernels less its warm-up, autotuning, unattributed, first-step and
    first-only buckets."""
    from harness.trace.analyses.assign import assign
    from harness.trace.analyses.breakdown import breakdown, load_profile

    profile = load_profile(DATA / fixture)
    bd = breakdown(profile)
    kept_out = (bd.warmup, bd.autotuning, bd.unattributed, bd.first_step, bd.first_only)
    a = assign(profile, bd.attribution)
    dur = profile.kernels.duration
    assert int(dur[a.measured].sum()) == int(dur.sum()) - sum(b.ns for b in kept_out)
    assert int(a.measured.sum()) == len(dur) - sum(b.count for b in kept_out)
