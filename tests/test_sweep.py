"""harness.sweep end to end on CPU (interrupted, resumed, one simulated OOM), its failure
records from real processes, bad input, and rendering of a stored CPU sweep.

tests/data/sweep/ holds cells.jsonl and sweep.json of a real CPU sweep (tiny, mini x ctx
16, 32 x torch, jax x fp32, bf16, warm-up 1, steps 3, with --warmup-study), made by:
    python -m harness.sweep --model tiny --ctx 16 --backend torch --dtype fp32 --device cpu \
        --warmup 1 --steps 3 --cell-timeout 1 --out results/cpu-fixture           # a timeout
    python -m harness.sweep --model tiny,mini --ctx 16,32 --backend torch,jax --dtype fp32,bf16 \
        --device cpu --warmup 1 --steps 3 --warmup-study --resume --out results/cpu-fixture \
        --fail-cell mini:32:jax:fp32:optimizer                                      # an OOM
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import sys
import time

import numpy as np
import pytest

from harness import sweep
from harness.common.stats import figure
from harness.config import get_config
from harness.runs import sweep as runner
from harness.sweeps import analysis
from harness.sweeps import records as sweep_records
from harness.sweeps import step_memory as memory_model

DATA = os.path.join(os.path.dirname(__file__), "data", "sweep")
FAIL = "tiny:32:jax:fp32"
GRID = ["--model", "tiny", "--ctx", "16,32", "--backend", "torch,jax", "--device", "cpu", "--warmup", "1",
        "--steps", "2"]


def _lines(out_dir: str) -> list[str]:
    with open(os.path.join(out_dir, sweep_records.CELLS_FILE)) as f:
        return f.read().splitlines()


# -- end to end ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def e2e(tmp_path_factory) -> dict:
    """Run 2 cells (--max-cells), resume for the other 2, then resume once more."""
    out = str(tmp_path_factory.mktemp("sweep") / "s")
    runs = {}
    for name, extra in (("first", ["--max-cells", "2"]), ("resumed", ["--resume"]), ("again", ["--resume"])):
        capture = _Capture()
        with capture:
            code = sweep.main([*GRID, "--out", out, "--fail-cell", f"{FAIL}:optimizer", *extra])
        runs[name] = {"code": code, "stderr": capture.text, "lines": _lines(out)}
    return {"out": out, **runs}


class _Capture:
    """Collects what the sweep writes to sys.stderr (its progress lines)."""

    def __enter__(self):
        import io

        self._old, sys.stderr = sys.stderr, io.StringIO()
        return self

    def __exit__(self, *exc) -> None:
        self.text = sys.stderr.getvalue()
        sys.stderr = self._old


@pytest.mark.slow
def test_interrupted_sweep_resumes_without_redoing_cells(e2e: dict) -> None:
    first, resumed, again = e2e["first"], e2e["resumed"], e2e["again"]
    assert first["code"] == 0 and len(first["lines"]) == 2
    assert resumed["lines"][:2] == first["lines"]  # recorded cells untouched
    keys = [json.loads(line)["key"] for line in resumed["lines"]]
    expected = {c.key for c in sweep_records.grid(["tiny"], [16, 32], ["torch", "jax"], ["fp32"])}
    assert sorted(keys) == sorted(expected)  # every cell exactly once
    assert "2 of 4 cells already recorded" in resumed["stderr"]
    assert resumed["stderr"].count("running") == 2
    assert again["lines"] == resumed["lines"] and "running" not in again["stderr"]


@pytest.mark.slow
def test_failed_cell_is_recorded_and_the_sweep_goes_on(e2e: dict) -> None:
    records = {r["key"]: r for r in map(json.loads, e2e["resumed"]["lines"])}
    oom = records.pop(FAIL)
    assert oom["status"] == "oom" and "out of memory in optimizer" in oom["reason"]
    assert oom["result"]["error"]["phase"] == "optimizer"  # (a split step out of memory in backward leaves JAX its fused step)
    for key, rec in records.items():
        assert rec["status"] == "ok", (key, rec["reason"])
        model, ctx, backend, dtype = key.split(":")
        o = rec["result"]["options"]
        assert (o["model"], o["ctx"], o["backend"], o["dtype"], o["warmup"], o["steps"]) == \
            (model, int(ctx), backend, dtype, 1, 2)
        assert set(rec["result"]["phases"]) >= {"forward", "backward", "optimizer", "step"}
        assert ("fused_step" in rec["result"]["phases"]) == (backend == "jax")
    assert e2e["resumed"]["code"] == e2e["again"]["code"] == 3  # a cell failed


@pytest.mark.slow
def test_progress_reports_done_running_left_and_time_left(e2e: dict) -> None:
    lines = [line for line in e2e["first"]["stderr"].splitlines() if "running" in line]
    assert lines[0] == ("[sweep] started tiny:16:torch:fp32; 0 done, running tiny:16:torch:fp32, 3 left, "
                        "time left: after the first cell")
    assert re.fullmatch(r"\[sweep\] started tiny:16:jax:fp32; 1 done, running tiny:16:jax:fp32, 2 left, "
                        r"~\d+m\d\ds left", lines[1])


def test_progress_line_spreads_the_estimate_over_gpus() -> None:
    # 4 cells of 60 s each still to finish (2 running, 2 queued) on 2 GPUs: 2 minutes.
    line = runner.progress_line(3, ["a", "b"], 2, [60.0, 60.0, 60.0], slots=2)
    assert line == "3 done, running a, b, 2 left, ~2m00s left"


def test_cells_run_side_by_side_one_per_gpu(tmp_path) -> None:
    """With two GPU slots the second cell starts before the first one ends, each cell
    sees only its own GPU index, and the records say which one it had."""
    out = str(tmp_path / "s")
    opts = dict(batch=1, warmup=0, steps=1, attention="naive", mode="train", device="cpu", nsys=False,
                optimizer="foreach")
    cells = [sweep_records.Cell("tiny", 8, "torch", "fp32"), sweep_records.Cell("tiny", 16, "torch", "fp32")]
    messages: list[str] = []
    runner.run_sweep(cells, opts, out, gpus=["3", "5"], log=messages.append)
    started = [i for i, m in enumerate(messages) if "started" in m]
    first_done = next(i for i, m in enumerate(messages) if " ok in " in m)
    assert len(started) == 2 and started[1] < first_done, messages
    assert "on GPU 3" in messages[started[0]] and "on GPU 5" in messages[started[1]]
    records = {r["key"]: r for r in sweep_records.load_records(out)}
    # Longest first: the ctx-16 cell starts on the first GPU.
    assert {k: r["gpu"] for k, r in records.items()} == {"tiny:16:torch:fp32": "3", "tiny:8:torch:fp32": "5"}
    assert all(r["status"] == "ok" for r in records.values())


def test_side_by_side_cells_start_with_the_longest() -> None:
    cells = sweep_records.grid(["small", "xl"], [128, 1024], ["torch", "jax"], ["fp32"])
    order = [c.key for c in runner.longest_first(cells)]
    assert order[0] == "xl:1024:jax:fp32" and order[-1] == "small:128:torch:fp32"
    assert order.index("xl:128:jax:fp32") < order.index("xl:128:torch:fp32")


def test_cpu_slices_are_disjoint_and_equal() -> None:
    slices = runner.cpu_slices(2)
    available = len(os.sched_getaffinity(0))
    if available < 2:
        assert slices == [None, None]
    else:
        assert len(slices[0]) == len(slices[1]) == available // 2 and not slices[0] & slices[1]


@pytest.mark.slow
def test_sweep_writes_its_report(e2e: dict) -> None:
    out = e2e["out"]
    with open(os.path.join(out, "report.md")) as f:
        report = f.read()
    assert "| tiny | 32 | OOM | OOM | OOM | OOM | OOM |" in report  # jax fp32 table
    with open(os.path.join(out, "cells.csv")) as f:
        assert len(list(csv.DictReader(f))) == 4
    for png in ("time_vs_ctx.png", "phases.png", "memory.png"):
        assert os.path.getsize(os.path.join(out, png)) > 1000


# -- failures without a result, from real processes ------------------------------------------
def _outcome(tmp_path, code: str, timeout: float | None = None) -> tuple[str, str]:
    log = str(tmp_path / "cell.log")
    exit_code, timed_out = runner.CellProcess([sys.executable, "-c", code], log, timeout).wait()
    return runner.outcome(None, exit_code, timed_out, timeout, log)


def test_a_signal_is_recorded_as_a_crash(tmp_path) -> None:
    status, reason = _outcome(tmp_path, "import os, signal; print('loading'); os.kill(os.getpid(), signal.SIGKILL)")
    assert status == "crashed" and "SIGKILL" in reason and "loading" in reason


def test_an_exit_without_result_is_recorded_as_a_crash(tmp_path) -> None:
    status, reason = _outcome(tmp_path, "import sys; sys.exit('segfault-like failure')")
    assert status == "crashed" and "exit code 1" in reason and "segfault-like failure" in reason


def test_a_cell_past_its_timeout_is_killed_and_recorded(tmp_path) -> None:
    # a million steps: no machine finishes them within the cell's second
    rec = runner.run_cell(sweep_records.Cell("tiny", 16, "torch", "fp32"), dict(batch=1, warmup=10**6, steps=10**6,
                         attention="naive", mode="train", device="cpu", nsys=False, optimizer="foreach"), str(tmp_path),
                         timeout=1)
    assert rec["status"] == "timeout" and rec["result"] is None and "--cell-timeout 1" in rec["reason"]
    # it had its second, and was killed rather than awaited: the run left no result
    assert rec["wall_s"] >= 1 and "(killed)" in rec["reason"]


# -- bad input --------------------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["--model", "tiny,huge", "--ctx", "16"], "unknown model 'huge'; choose one of tiny, mini, small"),
    (["--model", "tiny", "--ctx", "16,0"], "expected a positive integer, got '0'"),
    (["--model", "tiny", "--ctx", "sixteen"], "expected a positive integer, got 'sixteen'"),
    (["--model", "tiny", "--ctx", "16", "--backend", "torch,tf"], "unknown backend 'tf'; choose one of torch, torch-compile, torch-compile-cg, jax"),
    (["--model", "tiny", "--ctx", "16", "--dtype", "fp16"], "unknown dtype 'fp16'; choose one of fp32, tf32, bf16"),
    (["--model", "tiny"], "--model and --ctx are required"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], message: str, tmp_path, capsys) -> None:
    try:
        code = sweep.main([*argv, "--device", "cpu", "--out", str(tmp_path / "s")])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "s")


def test_resume_with_other_options_or_rerun_without_resume_is_refused(tmp_path, capsys) -> None:
    out = str(tmp_path / "s")
    sweep_records.prepare(out, dict(batch=4, warmup=1, steps=2, attention="naive", mode="train", device="cpu",
                                    nsys=False, optimizer="foreach"),
                  {"models": ["tiny"], "ctx": [16], "backends": ["torch"], "dtypes": ["fp32"]}, False, False)
    base = ["--model", "tiny", "--ctx", "16", "--backend", "torch", "--device", "cpu", "--warmup", "1",
            "--steps", "2", "--out", out]
    assert sweep.main(base) == 2 and "--resume" in capsys.readouterr().err
    assert sweep.main([*base[:-3], "3", "--out", out, "--resume"]) == 2
    assert "--steps 2 (now 3)" in capsys.readouterr().err


def test_resume_of_a_folder_without_a_sweep_is_refused(tmp_path, capsys) -> None:
    out = tmp_path / "typo"
    code = sweep.main(["--model", "tiny", "--ctx", "16", "--device", "cpu", "--resume", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--resume" in err and "holds no sweep" in err and "drop --resume" in err
    assert not out.exists()


def test_resume_with_new_axis_values_says_what_it_adds(tmp_path) -> None:
    out = str(tmp_path / "s")
    opts = dict(batch=4, warmup=1, steps=2, attention="naive", mode="train", device="cpu", nsys=False)
    axes = {"models": ["tiny"], "ctx": [16], "batches": [4], "backends": ["torch"], "dtypes": ["fp32"]}
    said: list[str] = []
    sweep_records.prepare(out, opts, axes, False, False, log=said.append)
    assert said == []
    sweep_records.prepare(out, {**opts, "batch": 8}, {**axes, "ctx": [16, 32], "batches": [8, 4]}, True, False,
                          log=said.append)
    assert said == [f"[sweep] --resume adds to the grid of {out}: ctx 32; batches 8"]
    stored = sweep_records.load_sweep(out)
    assert stored["axes"]["ctx"] == [16, 32] and stored["axes"]["batches"] == [4, 8]
    assert stored["options"]["batch"] == 4  # the base batch stays: its cells keep their keys


def test_resume_says_where_recorded_cells_ran_other_code(tmp_path) -> None:
    """A resume after the code changed says how many recorded cells ran which other source:
    the report then holds cells of two trees, which its rows do not tell apart."""
    from harness.common.provenance import source_digest

    out = str(tmp_path / "s")
    opts = dict(batch=4, warmup=1, steps=2, attention="naive", mode="train", device="cpu", nsys=False)
    axes = {"models": ["tiny"], "ctx": [16, 32], "batches": [4], "backends": ["torch"], "dtypes": ["fp32"]}
    said: list[str] = []
    sweep_records.prepare(out, opts, axes, False, False, log=said.append)
    here = source_digest()
    sweep_records.append_record(out, {"key": "a", "result": {"env": {"source_sha256": here}}})
    sweep_records.prepare(out, opts, axes, True, False, log=said.append)
    assert said == []  # every recorded cell ran this tree
    for key in ("b", "c"):
        sweep_records.append_record(out, {"key": key, "result": {"env": {"source_sha256": "f" * 64}}})
    sweep_records.append_record(out, {"key": "d", "result": None})  # a cell that left no document
    sweep_records.prepare(out, opts, axes, True, False, log=said.append)
    assert said == [f"[sweep] --resume: recorded cells of {out} ran other code than this tree's (source {here[:7]}): "
                    "2 ran source fffffff; the report will hold both"]


def test_fault_injection_is_hidden_from_help() -> None:
    assert "--fail-cell" not in sweep.build_parser().format_help()


def test_nsys_missing_is_a_usage_error(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("NSYS", str(tmp_path / "no-nsys"))
    code = sweep.main(["--model", "tiny", "--ctx", "16", "--device", "cpu", "--nsys", "--out", str(tmp_path / "s")])
    assert code == 2 and "nsys not found" in capsys.readouterr().err


# -- rendering a stored sweep ------------------------------------------------------------
@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict:
    out = str(tmp_path_factory.mktemp("stored") / "s")
    shutil.copytree(DATA, out)
    assert sweep.main(["--render", out]) == 0
    with open(os.path.join(out, "report.md")) as f:
        report = f.read()
    with open(os.path.join(out, "cells.csv")) as f:
        rows = list(csv.DictReader(f))
    records = {r["key"]: r for r in map(json.loads, _lines(out))}
    return {"out": out, "report": report, "csv": rows, "records": records, "data": analysis.analyze(out)}


def _median(records: dict, key: str, phase: str) -> float:
    return records[key]["result"]["phases"][phase]["median_ms"]


def _row(report: str, *cells: str) -> str:
    """The one markdown table row starting with `cells`, under the first heading holding it."""
    prefix = "| " + " | ".join(cells) + " |"
    found = [line for line in report.splitlines() if line.startswith(prefix)]
    assert found, prefix
    return found[0]


def test_stored_sweep_has_the_cells_it_claims(rendered: dict) -> None:
    statuses = {k: r["status"] for k, r in rendered["records"].items()}
    assert statuses.pop("mini:32:jax:fp32") == "oom"
    assert statuses.pop("tiny:16:torch:fp32") == "timeout"
    assert set(statuses.values()) == {"ok"} and len(statuses) == 22


def test_oom_and_failed_cells_never_render_as_numbers(rendered: dict) -> None:
    report = rendered["report"]
    jax_fp32 = report.split("### jax fp32")[1].split("###")[0]
    assert "| mini | 32 | OOM | OOM | OOM | OOM | OOM |" in jax_fp32
    torch_fp32 = report.split("### torch fp32")[1].split("###")[0]
    assert "| tiny | 16 | failed | failed | failed | failed |" in torch_fp32
    assert "- tiny:16:torch:fp32: failed (timeout): no result within --cell-timeout 1 s" in report
    for row in rendered["csv"]:
        if row["status"] != "ok":
            assert all(row[f"{p}_median_ms"] == "" for p in ("forward", "backward", "step")), row["key"]
            assert row["bwd_over_fwd"] == ""


def test_jax_over_torch_ratios(rendered: dict) -> None:
    rec, ratios = rendered["records"], rendered["data"]["ratios"]
    assert len(ratios) == 8
    for r in ratios:
        t, j = (f"{r['model']}:{r['ctx']}:{b}:{r['dtype']}" for b in ("torch", "jax"))
        if rec[t]["status"] != "ok" or rec[j]["status"] != "ok":
            side = "torch" if rec[t]["status"] != "ok" else "jax"
            text = "OOM" if rec[f"{r['model']}:{r['ctx']}:{side}:{r['dtype']}"]["status"] == "oom" else "failed"
            assert r["status"] == f"{text} ({side})" and r["step"] is None
            continue
        assert r["forward"] == pytest.approx(_median(rec, j, "forward") / _median(rec, t, "forward"))
        assert r["fused_step"] == pytest.approx(_median(rec, j, "fused_step") / _median(rec, t, "step"))
        assert f" {r['step']:.2f}x |" in _row(rendered["report"], r["model"], str(r["ctx"]), r["dtype"])
    oom = next(r for r in ratios if (r["model"], r["ctx"], r["dtype"]) == ("mini", 32, "fp32"))
    assert oom["status"] == "OOM (jax)"
    assert "| mini | 32 | fp32 | OOM (jax) | OOM (jax) |" in rendered["report"]


def test_backward_over_forward_and_speedups(rendered: dict) -> None:
    rec, data = rendered["records"], rendered["data"]
    for r in data["phases"]:
        if r["status"] == "ok":
            assert r["bwd_over_fwd"] == pytest.approx(_median(rec, r["key"], "backward") / _median(rec, r["key"],
                                                                                                   "forward"))
    assert len(data["bound_notes"]) == 8  # backend x dtype x model, each with a note
    speedups = data["speedups"]
    assert {(s["model"], s["ctx"], s["backend"]) for s in speedups} == \
        {(m, c, b) for m in ("tiny", "mini") for c in (16, 32) for b in ("torch", "jax")}
    for s in speedups:
        fp32, bf16 = (f"{s['model']}:{s['ctx']}:{s['backend']}:{d}" for d in ("fp32", "bf16"))
        if s["status"] == "ok":
            assert s["step"] == pytest.approx(_median(rec, fp32, "step") / _median(rec, bf16, "step"))
        else:
            expected = {"mini:32:jax:fp32": "OOM (fp32)", "tiny:16:torch:fp32": "failed (fp32)"}[fp32]
            assert s["step"] is None and s["status"] == expected


def _percentages(text: str) -> list[float]:
    return [float(p) for p in re.findall(r"(-?\d+(?:\.\d+)?)%", text)]


def test_no_percentage_above_100(rendered: dict) -> None:
    """The CPU runs have no MFU (no datasheet peak), so MFU is also rendered against a
    peak equal to the best cell's TFLOP/s: the best then reads exactly 100.0%."""
    import copy

    from harness.reports.sweep import section_throughput

    assert all(0 <= p <= 100 for p in _percentages(rendered["report"]))
    data = copy.deepcopy(rendered["data"])
    phases = [p for r in data["phases"] for p in (r["forward"], r["backward"], r["step"]) if p]
    peak = max(p["tflops"] for p in phases)
    for p in phases:
        p["mfu"] = p["tflops"] / peak
    shown = _percentages("\n".join(section_throughput(data)))
    assert len(shown) == 3 * 14  # forward, backward, step of the 14 ok cells of the main grid
    assert all(0 < p <= 100 for p in shown) and max(shown) == 100.0


def test_memory_prediction_and_fit(rendered: dict) -> None:
    data = rendered["data"]
    assert data["device_memory"]["bytes"] == 80 * 2**30  # CPU runs: the default
    for r in data["memory"]:
        expected = memory_model.predict(get_config(r["model"]), 4, r["ctx"], r["dtype"])["peaks"]
        assert {p: r[p]["predicted"] for p in expected} == expected
        assert r["predicted_fits"] and r["step"]["measured"] is None  # CPU: no device peak
    tight = analysis.analyze(rendered["out"], device_memory_gb=0.1)["memory"]
    assert {r["model"] for r in tight if not r["predicted_fits"]} == {"mini"}  # step peaks: mini ~0.15 GiB, tiny ~0.05


def test_warmup_study_table(rendered: dict) -> None:
    rows = rendered["data"]["warmup"]
    assert sorted((r["backend"], r["warmup"]) for r in rows) == \
        sorted((b, w) for b in ("torch", "jax") for w in sweep_records.WARMUP_STUDY)
    for r in rows:
        record = rendered["records"][f"tiny:16:{r['backend']}:fp32:w{r['warmup']}"]
        times = record["result"]["phases"]["step"]["times_ms"]
        assert r["step"]["first_ms"] == times[0]
    assert "## Warm-up study" in rendered["report"]
    assert _row(rendered["report"], "tiny", "16", "jax", "fp32", "0")


def test_csv_and_plots(rendered: dict) -> None:
    assert sorted(r["key"] for r in rendered["csv"]) == sorted(r["key"] for r in rendered["data"]["phases"])
    assert len(rendered["csv"]) == 16
    for png in ("time_vs_ctx.png", "phases.png", "memory.png"):
        with open(os.path.join(rendered["out"], png), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_kernel_rows_from_a_profile(tmp_path, monkeypatch) -> None:
    """--nsys cells: the breakdown of their profile (here a synthetic one) becomes shares."""
    from harness.trace.analyses import breakdown
    from harness.trace.profile import Kernel, Profile, Range

    profile = Profile(path="p.sqlite", label="torch", source="nsys",
                      kernels=[Kernel("ampere_sgemm_128x64_nn", 10, 40), Kernel("vectorized_elementwise_kernel", 50,
                                                                                60),
                               Kernel("ampere_sgemm_128x64_nn", 110, 150), Kernel("multi_tensor_apply_kernel", 160,
                                                                                  170)],
                      ranges=[Range("step", 0, 200), Range("forward", 0, 100), Range("backward", 100, 155),
                              Range("optimizer", 155, 200)])
    monkeypatch.setattr(breakdown, "load_profile", lambda path, label=None: profile)
    cells = [{"key": "tiny:16:torch:fp32", "cell": {"model": "tiny", "ctx": 16, "backend": "torch", "dtype": "fp32",
                                                     "warmup": None}, "profile": "runs/x.sqlite"}]
    (row,) = analysis.kernel_rows(cells, str(tmp_path))
    assert row["forward"]["top_kernel"] == "ampere_sgemm_128x64_nn" and row["forward"]["top_share"] == 0.75
    assert row["step"]["categories"] == pytest.approx({"gemm": 70 / 90, "elementwise": 10 / 90, "optimizer": 10 / 90})
    data = {"kernels": [row]}
    from harness.reports.sweep import section_kernels

    assert "ampere_sgemm_128x64_nn (75.0%)" in "\n".join(section_kernels(data))


def test_a_torn_last_line_is_skipped_and_closed_off(tmp_path) -> None:
    rec = {"key": "tiny:16:torch:fp32", "status": "ok"}
    (tmp_path / sweep_records.CELLS_FILE).write_text(json.dumps(rec) + '\n{"key": "tiny:32:tor')
    assert sweep_records.load_records(str(tmp_path)) == [rec]
    sweep_records.append_record(str(tmp_path), {**rec, "key": "tiny:32:torch:fp32"})
    assert [r["key"] for r in sweep_records.load_records(str(tmp_path))] == ["tiny:16:torch:fp32", "tiny:32:torch:fp32"]


# -- batch axis, best MFU, honest statuses, device memory, plots ----------------------------
H200 = os.path.join(os.path.dirname(DATA), "..", "..", "results", "sweep", "h200")


@pytest.fixture(scope="module")
def h200(tmp_path_factory) -> dict:
    """The committed H200 sweep (recorded before the batch axis existed), rendered afresh."""
    out = str(tmp_path_factory.mktemp("h200") / "s")
    shutil.copytree(H200, out)
    assert sweep.main(["--render", out]) == 0
    with open(os.path.join(out, "report.md")) as f:
        report = f.read()
    return {"out": out, "report": report, "data": analysis.analyze(out),
            "records": {r["key"]: r for r in map(json.loads, _lines(out))}}


@pytest.mark.slow
def test_batch_axis_runs_each_batch_and_records_its_oom(tmp_path, capsys) -> None:
    out = str(tmp_path / "s")
    code = sweep.main(["--model", "tiny", "--ctx", "16", "--backend", "torch", "--batch", "1,2", "--device", "cpu",
                       "--warmup", "0", "--steps", "1", "--out", out, "--fail-cell", "tiny:16:torch:fp32:b2:backward"])
    assert code == 3  # a cell failed
    records = {r["key"]: r for r in sweep_records.load_records(out)}
    assert set(records) == {"tiny:16:torch:fp32", "tiny:16:torch:fp32:b2"}
    assert records["tiny:16:torch:fp32"]["result"]["options"]["batch"] == 1
    oom = records["tiny:16:torch:fp32:b2"]
    assert oom["status"] == "oom" and oom["result"]["options"]["batch"] == 2
    with open(os.path.join(out, "report.md")) as f:
        report = f.read()
    assert report.startswith("# Sweep: batch 1, 2,")
    assert "| tiny | 16 | 2 | OOM | OOM | OOM | OOM |" in report  # the batch column
    ok = records["tiny:16:torch:fp32"]["result"]["phases"]["step"]
    # a CPU's TFLOP/s keep two significant digits where two decimals would read 0.00
    assert _row(report, "torch", "fp32", "tiny", "16", "1", "1", "step", "-", figure(ok["tflops"]))
    with open(os.path.join(out, "cells.csv")) as f:
        assert sorted(r["batch"] for r in csv.DictReader(f)) == ["1", "2"]


def test_best_cell_per_backend_is_the_fastest_whole_step(rendered: dict, h200: dict) -> None:
    for run in (rendered, h200):
        best = {(b["backend"], b["dtype"]): b for b in run["data"]["best"]}
        expected: dict[tuple, tuple] = {}
        for key, rec in run["records"].items():
            if rec["status"] != "ok" or rec["cell"]["warmup"] is not None:
                continue
            for phase in ("step", "fused_step"):
                p = rec["result"]["phases"].get(phase)
                group = (rec["cell"]["backend"], rec["cell"]["dtype"])
                if p and p["tflops"] and p["tflops"] > expected.get(group, (0,))[0]:
                    expected[group] = (p["tflops"], key, phase, p["mfu"])
        assert {g: (b["tflops"], b["key"], b["phase"], b["mfu"]) for g, b in best.items()} == expected
    # On the H200 the best bf16 cells of the committed sweep (batch 4):
    jax_bf16 = next(b for b in h200["data"]["best"] if (b["backend"], b["dtype"]) == ("jax", "bf16"))
    assert (jax_bf16["model"], jax_bf16["ctx"], jax_bf16["batch"], jax_bf16["phase"]) == ("large", 1024, 4,
                                                                                          "fused_step")
    assert f"| jax | bf16 | large | 1024 | 4 | 1 | fused_step | {100 * jax_bf16['mfu']:.1f}% |" in h200["report"]


def test_a_cell_that_was_not_run_never_reads_oom(tmp_path) -> None:
    out = str(tmp_path / "s")
    shutil.copytree(DATA, out)
    stored = sweep_records.load_sweep(out)
    stored["axes"]["dtypes"].append("tf32")  # a dtype no cell ran
    sweep_records.save_sweep(out, stored)
    data = analysis.analyze(out)
    from harness.reports.sweep import sweep_markdown

    report = sweep_markdown(data, [])
    for line in report.splitlines():
        if "| tf32 |" in line and not line.startswith("| mini | 32 | jax | tf32"):
            assert "OOM" not in line, line
    speedup = next(r for r in data["speedups"] if (r["model"], r["ctx"], r["backend"], r["dtype"]) ==
                   ("mini", 32, "jax", "tf32"))
    assert speedup["status"] == "OOM (fp32); not run (tf32)"  # the OOM is fp32's, recorded
    assert all(r["status"] == "not run" for r in data["ratios"] if r["dtype"] == "tf32")


def test_device_memory_comes_from_the_run_then_the_gpu_table() -> None:
    def cell(**env) -> dict:
        return {"result": {"env": env}}

    assert analysis.device_memory_bytes([cell(device="NVIDIA H200", gpu_memory="143771 MiB")])[0] == 143771 * 2**20
    recorded = analysis.device_memory_bytes([cell(device="NVIDIA H100 80GB HBM3", gpu_memory="81559 MiB")])
    assert recorded == (81559 * 2**20, "79.6 GiB, recorded by the run (nvidia-smi)")
    assert analysis.device_memory_bytes([cell(device="NVIDIA H200")])[0] == 143771 * 2**20  # no "GB" in the name
    assert analysis.device_memory_bytes([cell(device="NVIDIA A100-SXM4-40GB")])[0] == 40960 * 2**20
    assert analysis.device_memory_bytes([cell(device="NVIDIA A100-SXM4-80GB")])[0] == 81920 * 2**20
    assert analysis.device_memory_bytes([cell(device="Tesla V100-SXM2-32GB")])[0] == 32 * 2**30
    assert analysis.device_memory_bytes([cell(device="cpu")])[0] == 80 * 2**30
    assert analysis.device_memory_bytes([cell(device="NVIDIA H200")], gb=10)[0] == 10 * 2**30
    # What a run records: nvidia-smi's memory.total beside the name.
    from harness.common.results import parse_nvidia_smi

    parsed = parse_nvidia_smi("NVIDIA H200, 580.1, [N/A], [N/A], 143771 MiB\n")
    assert (parsed["gpu_name"], parsed["gpu_memory"]) == ("NVIDIA H200", "143771 MiB")


def test_h200_report_uses_the_h200_s_memory(h200: dict) -> None:
    assert h200["data"]["device_memory"]["bytes"] == 143771 * 2**20
    assert "140.4 GiB (143771 MiB), the datasheet memory of 'NVIDIA H200'" in h200["report"]


def _labelled_ticks(ax) -> list[str]:
    lo, hi = sorted(ax.get_ylim())
    locs = [v for v in ax.yaxis.get_major_locator()() if lo <= v <= hi]
    return [t for t in ax.yaxis.get_major_formatter().format_ticks(locs) if t]


def test_time_axes_have_labelled_ticks(rendered: dict, h200: dict) -> None:
    from harness.reports import sweep_plots as plots

    for run in (rendered, h200):
        fig = plots.time_figure(run["data"])
        fig.canvas.draw()
        for ax in fig.axes:
            values = [y for line in ax.get_lines() for y in line.get_ydata()]
            assert ax.get_yscale() == ("log" if max(values) / min(values) >= plots.LOG_SPAN else "linear")
            assert len(_labelled_ticks(ax)) >= 2, (ax.get_title(), ax.get_yscale())


def test_memory_plot_shows_the_measured_peaks(h200: dict) -> None:
    from harness.reports import sweep_plots as plots

    fig = plots.memory_figure(h200["data"])
    ax = next(a for a in fig.axes if a.get_title() == "large")
    lines = {line.get_label(): line for line in ax.get_lines()}
    torch_points = dict(zip(lines["measured torch fp32"].get_xdata(), lines["measured torch fp32"].get_ydata()))
    for ctx in (128, 256, 512, 1024):
        phases = h200["records"][f"large:{ctx}:torch:fp32"]["result"]["phases"]
        peak = max(phases[p]["peak_memory_bytes"] for p in ("forward", "backward", "optimizer"))
        assert torch_points[ctx] == pytest.approx(peak / 2**30)
    jax_points = dict(zip(lines["measured jax bf16"].get_xdata(), lines["measured jax bf16"].get_ydata()))
    fused = h200["records"]["large:1024:jax:bf16"]["result"]["phases"]["fused_step"]["peak_memory_bytes"]
    assert jax_points[1024] == pytest.approx(fused / 2**30)


@pytest.mark.slow
def test_data_parallel_axis_renders_the_scaling_table(tmp_path) -> None:
    """torch on 1 and 2 gloo processes: one cell each, keyed by N, and the scaling table
    worked out again here from the two records."""
    out = str(tmp_path / "s")
    code = sweep.main(["--model", "tiny", "--ctx", "16", "--batch", "1", "--backend", "torch", "--data-parallel",
                       "1,2", "--device", "cpu", "--warmup", "0", "--steps", "2", "--out", out])
    assert code == 0
    records = {r["key"]: r for r in sweep_records.load_records(out)}
    assert set(records) == {"tiny:16:torch:fp32", "tiny:16:torch:fp32:dp2"}
    one, two = records["tiny:16:torch:fp32"]["result"], records["tiny:16:torch:fp32:dp2"]["result"]
    assert "data_parallel" not in one and two["data_parallel"]["global_batch"] == 2
    tps1 = 16 / (one["phases"]["step"]["median_ms"] / 1e3)
    step2 = max(r["phases"]["step"]["median_ms"] for r in two["ranks"])
    tps2 = 2 * 16 / (step2 / 1e3)
    with open(os.path.join(out, "report.md")) as f:
        report = f.read()
    assert "## Scaling over devices" in report
    assert _row(report, "torch", "tiny ctx 16 batch 1/device fp32 naive cpu", "DDP, 25 MB buckets", "2", "step",
                f"{step2:.3f}", f"{tps2:.0f}", "-", f"{100 * tps2 / (2 * tps1):.1f}%")
    assert _row(report, "torch", "tiny ctx 16 batch 1/device fp32 naive cpu", "-", "1")
    assert "| tiny | 16 | 2 |" in report  # the N column of the phase tables
    with open(os.path.join(out, "cells.csv")) as f:
        assert sorted(r["data_parallel"] for r in csv.DictReader(f)) == ["1", "2"]


def test_memory_table_reads_one_way_and_predicts_only_torch(h200: dict) -> None:
    """Title and ratio column both measured over predicted; JAX rows carry no torch prediction."""
    report = h200["report"]
    section = report.split("## Peak memory (GiB): measured / predicted")[1].split("\n## ")[0]
    assert "predicted/measured" not in section and "| step measured/predicted |" in section
    torch_row = next(r for r in h200["data"]["memory"] if r["key"] == "large:256:torch:fp32")
    line = _row(section, "large", "256", "torch", "fp32")
    phases = h200["records"]["large:256:torch:fp32"]["result"]["phases"]
    measured = max(phases[p]["peak_memory_bytes"] for p in ("forward", "backward", "optimizer"))
    assert f"| {measured / torch_row['step']['predicted']:.2f}x |" in line
    jax_line = _row(section, "large", "256", "jax", "fp32")
    assert f"/ {torch_row['step']['predicted'] / 2**30:.3g} |" not in jax_line
    assert jax_line.split(" | ")[-2:] == ["-", "- |"]  # no ratio, no fit


def test_no_fit_against_a_made_up_device_memory_on_a_cpu(rendered: dict, tmp_path) -> None:
    from harness.reports.sweep import section_memory

    assert "fits (predicted)" not in rendered["report"] and "80 GiB" not in rendered["report"]
    sized = analysis.analyze(rendered["out"], device_memory_gb=0.1)
    assert "| fits (predicted) |" in "\n".join(section_memory(sized))


def test_regime_note_says_throughout_for_one_regime(rendered: dict) -> None:
    notes = [line for line in rendered["report"].splitlines() if "reaches 1.5x" in line or "stays below" in line]
    assert notes and not any(re.search(r"\((\S[^>]*) -> \1\)", line) for line in notes)
    assert "(compute-bound throughout)" in rendered["report"]  # jax bf16 tiny: both contexts steady


def _bound_row(ctx: int, ratio: float, backward_ms: list[float]) -> dict:
    """A phase row of one cell: forward steady at 10 ms, the backward's step times given."""
    phase = lambda times: {"median_ms": float(np.median(times)), "times_ms": times}  # noqa: E731
    row = {"backend": "jax", "dtype": "fp32", "model": "tiny", "ctx": ctx, "batch": 4, "data_parallel": 1,
           "key": f"tiny:{ctx}", "status": "ok", "forward": phase([10.0, 10.1, 10.2])}
    row["backward"] = phase(backward_ms)
    row["bwd_over_fwd"] = ratio
    row["noisy"] = [name for name in ("forward", "backward") if analysis.noisy(row[name])]
    return row


def test_the_regime_is_not_concluded_from_noisy_steps(rendered: dict) -> None:
    """The issue's case: in tests/data/sweep jax fp32 tiny read "memory-bound at ctx 16 ->
    compute-bound at ctx 32", but its ctx-16 backward ran 5.67-10.08 ms (p90 9.33 = 1.61x its
    p10 5.80, by hand) and ctx 32's forward 5.68-10.89 ms: noisy steps, no conclusion."""
    from harness.reports.sweep import section_bound

    report = rendered["report"]
    assert "memory-bound at ctx 16 -> compute-bound at ctx 32" not in report
    line = next(line for line in report.splitlines() if line.startswith("- jax fp32 tiny:"))
    assert "16: 1.31x (noisy), 32: 2.34x (noisy)" in line and "not judged" in line
    row = next(r for r in rendered["data"]["phases"] if r["key"] == "tiny:16:jax:fp32")
    assert row["noisy"] == ["backward"] and analysis.regime(row).startswith("not judged (noisy backward")
    # planted: a steady memory-bound ctx 16 and a compute-bound ctx 32, steady or noisy
    data = {"phases": [], "batches": [4], "data_parallel": [1]}
    steady = [_bound_row(16, 1.2, [12.0, 12.1, 12.2]), _bound_row(32, 1.9, [19.0, 19.1, 19.2])]
    text = "\n".join(section_bound({**data, "bound_notes": analysis.bound_notes(steady)}))
    assert "(memory-bound at ctx 16 -> compute-bound at ctx 32)" in text and "reaches 1.5x at ctx 32" in text
    shaky = [steady[0], _bound_row(32, 1.9, [10.0, 19.0, 30.0])]  # p90 27.8 > 1.5 x p10 11.8
    text = "\n".join(section_bound({**data, "bound_notes": analysis.bound_notes(shaky)}))
    assert "->" not in text and "reaches 1.5x" not in text
    assert "32: 1.90x (noisy)" in text and "(memory-bound at every steady context; ctx 32 noisy, not judged)" in text


def test_memory_axis_starts_at_zero(rendered: dict) -> None:
    from harness.reports import sweep_plots as plots

    fig = plots.memory_figure(rendered["data"])
    for ax in fig.axes:
        lo, hi = ax.get_ylim()
        assert lo == 0 and hi >= max(y for line in ax.get_lines() for y in line.get_ydata())


def test_time_colours_follow_the_backend_over_two_batches(rendered: dict) -> None:
    import copy

    from harness.reports import sweep_plots as plots

    data = copy.deepcopy(rendered["data"])
    doubled = [{**r, "batch": 8} for r in data["phases"]]
    data["phases"] += doubled
    data["batches"] = [4, 8]
    fig = plots.time_figure(data)
    for ax in fig.axes:
        colours: dict[str, set] = {}
        for line in ax.get_lines():
            colours.setdefault(line.get_label().split()[0], set()).add(line.get_color())
        assert all(len(c) == 1 for c in colours.values()) and len(set.union(*colours.values())) == len(colours)


def test_best_mfu_ranks_per_device_and_regime_is_judged_on_one_device() -> None:
    """The issue's case: JAX at N=4 had the larger summed TFLOP/s but the lower MFU per
    device (32.1% against 38.5% at N=1); the best cell is the N=1 one, and N is shown."""
    from harness.sweeps.analysis import best_rows, regime

    def row(n: int, mfu: float, tflops: float) -> dict:
        return {"backend": "jax", "dtype": "bf16", "model": "large", "ctx": 1024, "batch": 4, "data_parallel": n,
                "key": f"n{n}", "status": "ok", "step": None, "bwd_over_fwd": 2.74,
                "fused_step": {"tflops": tflops, "mfu": mfu, "tokens_per_s": 1.0, "median_ms": 1.0}}

    best = best_rows([row(1, 0.385, 380.0), row(4, 0.321, 317.0)])
    assert [(b["data_parallel"], b["mfu"]) for b in best] == [(1, 0.385)]
    assert regime(row(1, 0.385, 380.0)) == "compute-bound"
    assert regime(row(4, 0.321, 317.0)).startswith("not judged")


def test_ddp_options_reach_the_torch_cells_only() -> None:
    from harness.runs.sweep import cell_command
    from harness.sweeps.records import Cell

    opts = {"attention": "naive", "warmup": 1, "steps": 2, "device": "cuda", "mode": "train", "optimizer": "fused",
            "batch": 4, "parallel": "ddp", "ddp_bucket_mb": 100.0, "ddp_static_graph": True, "grad_comm": "bf16"}
    torch_cmd = cell_command(Cell("large", 1024, "torch", "bf16", data_parallel=4), opts, "o.json")
    jax_cmd = cell_command(Cell("large", 1024, "jax", "bf16", data_parallel=4), opts, "o.json")
    assert " ".join(torch_cmd).endswith("--data-parallel 4 --parallel ddp --ddp-bucket-mb 100 --ddp-static-graph "
                                        "--grad-comm bf16")
    assert "--ddp-bucket-mb" not in jax_cmd and jax_cmd[-4:] == ["--data-parallel", "4", "--parallel", "ddp"]


def test_cpu_tflops_keep_their_digits(rendered: dict) -> None:
    """A CPU cell's TFLOP/s (0.00082) printed with two decimals read "0.00"; below
    0.005 it keeps two significant digits, so no cell reads as no work done."""
    from harness.reports.sweep import section_throughput

    text = "\n".join(section_throughput(rendered["data"]))
    assert "| 0.00 |" not in text
    small = [p["tflops"] for r in rendered["data"]["phases"] if r["status"] == "ok"
             for p in (r["forward"], r["backward"], r["step"]) if p and p["tflops"] and p["tflops"] < 0.005]
    assert small and all(f"| {t:.2g} |" in text for t in small)


def test_a_stopped_cell_gets_sigterm_before_sigkill(tmp_path) -> None:
    """Stopping a cell (Ctrl-C or SIGTERM to the sweep, its timeout) sends its process group
    SIGTERM first, so that its harness.run stops what it started: a data-parallel launcher's
    ranks run in sessions of their own, which a SIGKILL of the group leaves running."""
    marker, log = tmp_path / "stopped", tmp_path / "cell.log"
    code = (f"import signal, sys, time\ndef stop(*_):\n    open({str(marker)!r}, 'w').close()\n    sys.exit(130)\n"
            "signal.signal(signal.SIGTERM, stop)\nprint('ready', flush=True)\ntime.sleep(60)\n")
    job = runner.CellProcess([sys.executable, "-c", code], str(log), None)
    deadline = time.monotonic() + 30
    while "ready" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    job.kill()
    assert marker.exists() and job.proc.returncode == 130
