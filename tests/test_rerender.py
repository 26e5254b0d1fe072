"""`python -m harness.compare --render FOLDER`: an existing result folder rendered again with
today's code, old documents upgraded from their recorded step times."""

import json
import os
import shutil

import numpy as np
import pytest

from harness import compare

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A document of the old format as it was committed: one H200 comparison before the robust statistics.
COMMITTED_OLD = os.path.join(ROOT, "results", "main-job", "large-ctx256-bf16-h200", "summary-original.json")

TORCH_BACKWARD = [61.0, 62.5, 60.8, 63.1, 61.9, 62.2, 88.0, 61.4, 62.0, 61.7]
JAX_BACKWARD = [22.1, 21.9, 22.0, 22.3, 21.8, 22.2, 22.05, 21.95, 22.15, 216.3]  # the last step 10x the others
FLOPS = 4_014_536_130_560
PEAK = 989.4


def _old_phase(times: list[float], flops: int = 0) -> dict:
    t = np.asarray(times)
    return {"mean_ms": float(t.mean()), "std_ms": float(t.std(ddof=1)), "median_ms": float(np.median(t)),
            "min_ms": float(t.min()), "max_ms": float(t.max()), "n": len(times), "times_ms": times,
            "tokens_per_s": 1.0, "flops": flops, "tflops": 1.0, "mfu": 0.5, "peak_memory_bytes": 2**30}


def _old_run(backend: str, backward: list[float], overhead_ratio: float) -> dict:
    return {"schema": "harness.run/1", "status": "ok", "error": None,
            "options": {"backend": backend, "model": "large", "ctx": 256, "batch": 4, "dtype": "bf16",
                        "attention": "naive", "mode": "train"},
            "num_params": 969_411_840, "flops_formula": "backward = 2*forward", "precision": "bf16 matmuls",
            "phases": {"backward": _old_phase(backward, FLOPS)},
            "overhead": {"plain_step_ms": 41.0, "instrumented_step_ms": 41.0 * overhead_ratio,
                         "compared": "median step vs mean of a plain loop", "ratio": overhead_ratio},
            "loss": {"first": 6.3, "last": 5.5}, "peak_tflops": PEAK, "memory_note": "peak",
            "env": {"device": "NVIDIA H200"}}


def _old_summary() -> dict:
    runs = {"torch": _old_run("torch", TORCH_BACKWARD, 1.0553), "jax": _old_run("jax", JAX_BACKWARD, 0.5952)}
    table = [{"phase": "backward", "torch": runs["torch"]["phases"]["backward"],
              "jax": runs["jax"]["phases"]["backward"]}]  # no "ratios": today's render_markdown fails on it
    parity = {"ok": True, "tolerances": {"loss": 0.01},
              "worst": {"loss": {"quantity": "loss", "tensor": "loss", "rel_err": 1e-5, "tol": 0.01}},
              "reduced_batch": False}
    return {"schema": "harness.compare/1", "ok": True,
            "options": {"model": "large", "ctx": 256, "batch": 4, "dtype": "bf16", "attention": "naive",
                        "mode": "train", "device": "cuda", "warmup": 5, "steps": 10, "seed": 0},
            "device": "NVIDIA H200", "runs": runs, "table": table, "parity": parity, "env": {}, "plot": "phases.png"}


def _cell(times: list[float]) -> str:
    p10, med, p90 = np.percentile(np.asarray(times), [10, 50, 90])
    return f"{med:.3f} ({p10:.3f}-{p90:.3f})"


@pytest.fixture
def old_folder(tmp_path):
    folder = tmp_path / "large-ctx256-bf16-h200"
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps(_old_summary(), indent=1))
    return folder


def test_old_document_is_rendered_with_recomputed_statistics(old_folder, capsys):
    original = (old_folder / "summary.json").read_bytes()
    assert compare.main(["--render", str(old_folder)]) == 0
    assert "wrote" in capsys.readouterr().out
    report = (old_folder / "report.md").read_text()
    row = next(line for line in report.splitlines() if line.startswith("| backward"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    med_t, med_j = np.median(TORCH_BACKWARD), np.median(JAX_BACKWARD)
    tflops_t, tflops_j = FLOPS / (med_t / 1e3) / 1e12, FLOPS / (med_j / 1e3) / 1e12
    assert cells[1:] == [_cell(TORCH_BACKWARD), _cell(JAX_BACKWARD), f"{med_j / med_t:.2f}x",
                         f"{tflops_t:.2f}", f"{tflops_j:.2f}", f"{100 * tflops_t / PEAK:.1f}%",
                         f"{100 * tflops_j / PEAK:.1f}%", "1.00", "1.00"]
    # The 10x last step is listed by index, not folded into a standard deviation; no cause is invented.
    assert f"- jax: outlier: backward, measured step 9: {JAX_BACKWARD[9]:.2f} ms ({JAX_BACKWARD[9] / med_j:.1f}x the median)\n" \
        in report
    assert "±" not in report
    # The old overhead ratios are not printed as figures; the report says why, once.
    assert "0.595" not in report and "1.055" not in report and "Instrumentation overhead:" not in report
    assert report.count("instrumentation-overhead ratio of these runs is not shown") == 1
    assert "Time to first step was not recorded" in report and "time to first step (s)" not in report
    assert "garbage collector paused" not in report
    upgraded = json.loads((old_folder / "summary.json").read_text())
    assert upgraded["rerendered"]["from_schema"] == "harness.compare/1 with harness.run/1 runs"
    assert upgraded["table"][0]["ratios"]["jax"] == pytest.approx(med_j / med_t)
    rec = upgraded["runs"]["jax"]["phases"]["backward"]
    assert rec["p90_ms"] == pytest.approx(np.percentile(JAX_BACKWARD, 90))
    assert rec["mean_ms"] == pytest.approx(np.mean(JAX_BACKWARD)) and upgraded["runs"]["jax"]["overhead"] is None
    assert (old_folder / "summary-original.json").read_bytes() == original
    assert (old_folder / "phases.png").stat().st_size > 0


def test_rendering_again_changes_nothing(old_folder):
    assert compare.main(["--render", str(old_folder)]) == 0
    first = {f: (old_folder / f).read_bytes() for f in ("report.md", "summary.json", "summary-original.json")}
    assert compare.main(["--render", str(old_folder)]) == 0
    assert {f: (old_folder / f).read_bytes() for f in first} == first


def test_committed_old_document_renders(tmp_path):
    """The real H200 document: the JAX backward that printed 22.017 ± 61.414 ms."""
    with open(COMMITTED_OLD) as f:
        old = json.load(f)
    times = old["runs"]["jax"]["phases"]["backward"]["times_ms"]
    shutil.copy(COMMITTED_OLD, tmp_path / "summary.json")
    assert compare.main(["--render", str(tmp_path)]) == 0
    report = (tmp_path / "report.md").read_text()
    assert f"| backward | {_cell(old['runs']['torch']['phases']['backward']['times_ms'])} | {_cell(times)} |" in report
    assert "jax: outlier: backward, measured step 9: 216.26 ms" in report
    assert "61.414" not in report and "0.890" not in report and "ratio 1.055" not in report


def test_kernel_breakdown_is_kept_from_kernels_md(old_folder):
    (old_folder / "kernels.md").write_text("# Kernel breakdown\n\n- **torch**: `torch.sqlite`\n")
    assert compare.main(["--render", str(old_folder)]) == 0
    report = (old_folder / "report.md").read_text()
    assert "## Kernel breakdown\n\n- **torch**: `torch.sqlite`" in report
    assert "kernel breakdown below is kernels.md as the original run wrote it" in report


@pytest.mark.parametrize("make", ["missing", "file", "empty", "not-json", "not-compare"])
def test_bad_folder_is_one_line_naming_render(tmp_path, capsys, make):
    folder = tmp_path / "folder"
    if make == "file":
        folder.write_text("x")
    elif make != "missing":
        folder.mkdir()
        if make == "not-json":
            (folder / "summary.json").write_text("{")
        elif make == "not-compare":
            (folder / "summary.json").write_text(json.dumps({"schema": "harness.sweep/1"}))
    assert compare.main(["--render", str(folder)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith(f"error: --render {folder}: ") and "harness.compare" in err and "pass a result folder" in err


def test_compare_without_ctx_names_ctx_and_render(capsys):
    assert compare.main(["--model", "tiny", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "error: --ctx is required (or --render FOLDER to re-render a result folder)"


def _dp_run(backend: str, times: list[float], flops: int, tokens: int, peak: float) -> dict:
    """A data-parallel run document as written before per-device figures (2 devices,
    --batch 4, ctx 256): JAX's FLOPs and peak summed over its devices, a torch rank's
    tokens/s over its own rows."""
    from harness.common.stats import summarize

    rec = {**summarize(times), "times_ms": times, "flops": flops, "peak_memory_bytes": None}
    seconds = rec["median_ms"] / 1e3
    rec.update(tokens_per_s=tokens / seconds, tflops=flops / seconds / 1e12, mfu=flops / seconds / 1e12 / peak)
    doc = _old_run(backend, times, 1.0)
    doc.update(phases={"backward": rec}, peak_tflops=peak, overhead=None,
               data_parallel={"n": 2, "parallel": "ddp", "step_ms": 70.0, "global_batch": 8, "tokens_per_s": 1.0,
                              "ranks": [{"rank": 0}], "note": "one process", "spread": {}})
    doc["options"]["data_parallel"] = 2
    if backend == "torch":
        doc["ranks"] = [{"rank": r, "phases": {"backward": dict(rec)}, "loss": doc["loss"]} for r in (0, 1)]
    return doc


def test_data_parallel_folder_from_before_per_device_figures_is_upgraded(tmp_path):
    folder = tmp_path / "large-ctx256-bf16-ddp2-h200"
    folder.mkdir()
    summary = _old_summary()
    summary["runs"] = {"torch": _dp_run("torch", TORCH_BACKWARD, FLOPS, 4 * 256, PEAK),
                       "jax": _dp_run("jax", JAX_BACKWARD, 2 * FLOPS, 8 * 256, 2 * PEAK)}
    summary["data_parallel"] = {"n": 2, "parallel": "ddp"}
    summary["parity"]["tolerances"] = {"jax": {"loss": 0.01}}  # today's form: one table per backend
    (folder / "summary.json").write_text(json.dumps(summary))
    assert compare.main(["--render", str(folder)]) == 0
    new = json.loads((folder / "summary.json").read_text())
    jax, torch = new["runs"]["jax"], new["runs"]["torch"]
    med_t, med_j = np.median(TORCH_BACKWARD), np.median(JAX_BACKWARD)
    assert jax["peak_tflops"] == PEAK and jax["phases"]["backward"]["flops"] == FLOPS
    assert jax["phases"]["backward"]["tflops"] == pytest.approx(FLOPS / (med_j / 1e3) / 1e12, rel=1e-12)
    assert jax["phases"]["backward"]["mfu"] == pytest.approx(FLOPS / (med_j / 1e3) / 1e12 / PEAK, rel=1e-12)
    assert torch["phases"]["backward"]["tokens_per_s"] == pytest.approx(8 * 256 / (med_t / 1e3), rel=1e-12)
    assert torch["ranks"][1]["phases"]["backward"]["tokens_per_s"] == pytest.approx(8 * 256 / (med_t / 1e3))
    assert new["table"][0]["jax"]["tflops"] == jax["phases"]["backward"]["tflops"]
    report = (folder / "report.md").read_text()
    assert "per-device figures recomputed" in report and "jax TFLOP/s per device" in report
    assert "data-parallel 2 (replicated (parameters and AdamW state on every device))" in report
    assert "data-parallel 2 (DDP)" in report
    assert (folder / "summary-original.json").exists()
    first = (folder / "summary.json").read_bytes()
    assert compare.main(["--render", str(folder)]) == 0 and (folder / "summary.json").read_bytes() == first


def _cut(summary: dict, make: str) -> dict:
    """`summary` cut short or hand-edited the way `make` names."""
    if make.startswith("no "):
        del summary[make[3:]]
    elif make == "runs a list":
        summary["runs"] = list(summary["runs"].values())
    elif make == "a run a string":
        summary["runs"]["jax"] = "ok"
    elif make == "options without model":
        del summary["options"]["model"]
    elif make == "a phase a string":  # past the key checks: caught where the report reads it
        summary["table"][0]["torch"] = "12 ms"
    return summary


@pytest.mark.parametrize("make, named", [
    ("no parity", "no key 'parity'"), ("no table", "no key 'table'"), ("no options", "no key 'options'"),
    ("no runs", "not a harness.compare document"), ("runs a list", "'runs' is a list, not an object"),
    ("a run a string", "runs['jax'] is a string, not an object"), ("options without model", "'options' has no 'model'"),
    ("a phase a string", "cannot be rendered (TypeError")])
def test_render_of_a_cut_or_edited_summary_names_the_key_and_keeps_the_folder(tmp_path, capsys, make, named):
    """One line naming the key (and the file), exit 2, and every file of the folder as it was:
    a render never empties the report it could not write again."""
    folder = tmp_path / "tiny-ctx16-fp32-cpu"
    folder.mkdir()
    with open(os.path.join(ROOT, "tests", "data", "compare_cpu", "summary.json")) as f:
        (folder / "summary.json").write_text(json.dumps(_cut(json.load(f), make)))
    (folder / "report.md").write_text("# the report as it was\n")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert compare.main(["--render", str(folder)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"error: --render {folder}: ") and named in err, err
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
