"""compare's terminal table, report.md and phases.png on a real CPU run's summary.

tests/data/compare_cpu/summary.json is `harness.compare --model tiny --ctx 64 --warmup 1
--steps 5` on a 2-core CPU machine busy with other work (README beside it): torch's and
torch-compile's steps spread over 3x, JAX's did not.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from harness.common.stats import NOISY_SPREAD
from harness.reports import compare as compare_render
from harness.reports.compare import compare_markdown, format_table, plot_phases
from harness.reports.compare_answer import noise_warnings
from harness.reports.run import format_result

SUMMARY = Path(__file__).parent / "data" / "compare_cpu" / "summary.json"


@pytest.fixture()
def summary() -> dict:
    return json.loads(SUMMARY.read_text())


def _spread(times: list[float]) -> float:
    p10, p90 = np.percentile(times, [10, 90])
    return p90 / p10


def test_noisy_machine_warns_that_ratios_are_not_to_be_trusted(summary: dict) -> None:
    runs = summary["runs"]
    noisy = {b for b, r in runs.items() if _spread(r["phases"]["step"]["times_ms"]) > NOISY_SPREAD}
    assert noisy == {"torch", "torch-compile"}  # JAX's steps stayed within 1.5x on the same machine
    table, md = format_table(summary), compare_markdown(summary)
    for backend in noisy:
        times = runs[backend]["phases"]["step"]["times_ms"]
        line = (f"{backend}: step times range {min(times):.1f}-{max(times):.1f} ms, p90 "
                f"{_spread(times):.1f}x p10")
        assert f"warning: {line}" in table and f"- {line}" in md
    assert "ratios between backends and the instrumentation overhead are not to be trusted" in table
    assert "**Warning: noisy timings.**" in md and "jax: step" not in md


def test_an_attribution_run_says_so_before_its_table(summary: dict) -> None:
    """The README's `compare --profile --annotate-attention` showed JAX many times slower than
    torch (op by op, synchronized inside attention) with nothing to say those times are no
    speed figures; the terminal table and report.md now say so above the table."""
    assert compare_render.attribution_note(summary) is None
    assert "attribution run" not in format_table(summary) + compare_markdown(summary)
    for backend in ("torch", "jax"):  # the run documents of an --annotate-attention comparison
        summary["runs"][backend]["options"]["annotate_attention"] = True
    table, md = format_table(summary).splitlines(), compare_markdown(summary)
    assert table[1].startswith("warning: attribution run (--annotate-attention)") and "not speed figures" in table[1]
    assert table[2].startswith("phase")
    assert md.index("**Attribution run (--annotate-attention)") < md.index("| phase |")


def test_steady_runs_get_no_noise_warning(summary: dict) -> None:
    for r in summary["runs"].values():
        for p in r["phases"].values():
            median = p["median_ms"]
            p.update(p10_ms=0.95 * median, p90_ms=1.05 * median, min_ms=0.9 * median, max_ms=1.1 * median)
        r["overhead"]["round_ratios"] = [1.01, 1.02, 1.03, 1.04]
    assert noise_warnings(summary) == []
    assert "not to be trusted" not in format_table(summary)
    # instrumented steps faster than plain ones in every round: something else slowed the baseline
    summary["runs"]["jax"]["overhead"]["round_ratios"] = [0.6, 0.7, 0.8, 0.9]
    assert noise_warnings(summary)[0] == ("jax: instrumented steps ran faster than plain ones in every "
                                          "overhead round")


def test_cpu_report_has_no_empty_columns_and_no_gpu_text(summary: dict) -> None:
    rows = compare_render.table_rows(summary)
    header = rows[0]
    assert not any("MFU" in h or "peak GiB" in h for h in header)  # every cell "-" on a CPU
    assert all(any(r[i] != "-" for r in rows[1:]) for i in range(1, len(header)))
    md = compare_markdown(summary)
    assert "TF32" not in md and "cuDNN" not in md
    assert "everything in float32." in md and "matmul precision 'highest'." in md
    assert "TFLOP/s (fp32)" not in md and "No MFU: this device is not in the peak table" in md
    assert "max_memory_allocated" not in md and "peak_bytes_in_use" not in md
    assert md.count("Memory: no peak measured (no device allocator on a CPU).") == 3


def test_columns_and_memory_text_return_where_there_are_figures(summary: dict) -> None:
    r = summary["runs"]["torch"]
    step = next(row for row in summary["table"] if row["phase"] == "step")
    for p in (r["phases"]["step"], step["torch"]):
        p.update(peak_memory_bytes=3 * 2**30, mfu=0.25)
    header = compare_render.table_rows(summary)[0]
    assert {"torch MFU", "jax MFU", "torch peak GiB", "jax peak GiB"} <= set(header)
    assert "Memory: torch: max_memory_allocated after a reset before each phase." in compare_markdown(summary)


def test_report_records_the_command_the_user_ran(summary: dict) -> None:
    md = compare_markdown(summary)
    assert "- command: `python -m harness.compare --model tiny --ctx 64 --out cmp --warmup 1 --steps 5`" in md


def test_data_parallel_table_says_whose_phases_it_shows(summary: dict) -> None:
    torch = summary["runs"]["torch"]
    torch["data_parallel"] = {"n": 2, "parallel": "ddp", "global_batch": 8, "step_ms": 1200.0,
                              "tokens_per_s": 1.0, "ranks": [{"rank": 0}, {"rank": 1}], "spread": {}}
    assert compare_render.table_rows(summary)[0][1] == "torch rank 0 ms (median, p10-p90)"
    text = format_result(torch)
    assert "rank 0's phases (the data-parallel step below is the slowest rank's median):" in text


def test_phase_bars_leave_out_phases_a_backend_lacks(summary: dict, tmp_path, monkeypatch) -> None:
    from matplotlib.figure import Figure

    drawn = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *args, **kwargs: drawn.append(fig))
    assert plot_phases(copy.deepcopy(summary), str(tmp_path / "phases.png"))
    (ax,) = drawn[0].axes
    bars = {c.get_label(): [b.get_height() for b in c] for c in ax.containers if hasattr(c, "patches")}
    assert len(bars["torch"]) == len(bars["torch-compile"]) == 4 and len(bars["jax"]) == 5
    assert all(h > 0 for heights in bars.values() for h in heights)
    assert bars["torch"][3] == pytest.approx(summary["runs"]["torch"]["phases"]["step"]["median_ms"])
    assert "whiskers: 10th-90th percentile" in ax.get_title()


def test_overhead_flag_is_printed_once_not_again_as_a_warning(summary: dict) -> None:
    """The runner records an overhead flag twice (in `overhead` and among `warnings`); the
    terminal text, compare's table and report.md print it once, on the overhead line."""
    jax = summary["runs"]["jax"]
    flag = "ratio below 1 within the rounds' spread (0.844-1.236x): no measurable overhead"
    jax["overhead"]["flag"] = flag
    jax["warnings"] = [f"instrumentation overhead: {flag}", "a warning of its own"]
    jax["layer_ranges"] = {"overhead_ratio": 1.2, "round_ratios": [1.1, 1.3], "flag": "layers flag"}
    jax["warnings"].append("layer ranges overhead: layers flag")
    for text in (format_result(jax), format_table(summary), compare_markdown(summary)):
        assert text.count(flag) == 1 and text.count("layers flag") == 1
        assert "a warning of its own" in text
    assert f"instrumentation overhead: 1.008x plain steps (rounds 0.844-1.236): {flag}" in format_result(jax)


def test_cpu_tflops_keep_their_digits(summary: dict) -> None:
    """A CPU's TFLOP/s (0.0023) printed with two decimals read "0.00", as if no work was done."""
    torch = summary["runs"]["torch"]
    step = torch["phases"]["step"]
    expected = f"{step['flops'] / (step['median_ms'] / 1e3) / 1e12:.2g}"
    assert expected == "0.0026"
    rows = compare_render.table_rows(summary)
    col = rows[0].index("torch TFLOP/s")
    assert next(r for r in rows if r[0] == "step")[col] == expected
    assert not any(r[col] == "0.00" for r in rows)
    line = next(x for x in format_result(torch).splitlines() if x.startswith("step "))
    assert line.split()[-3] == expected
    assert compare_render._tf({"tflops": 12.345}) == "12.35" and compare_render._tf({"tflops": None}) == "-"


def test_fast_outlier_says_how_much_faster_than_the_median() -> None:
    """A step far below the median (a CPU optimizer phase: 1.7 ms among ~200 ms) printed as
    "0.0x the median"; it reads as how many times faster than the median it ran."""
    from harness.common.stats import summarize

    times = [200.0, 210.0, 205.0, 1.7, 202.0, 208.0, 204.0]
    rec = summarize(times)
    assert [o["index"] for o in rec["outliers"]] == [3]
    doc = {"phases": {"optimizer": rec}}
    (line,) = compare_render.outlier_lines(doc)
    assert line == f"outlier: optimizer, measured step 3: 1.70 ms ({204.0 / 1.7:.1f}x faster than the median)"
    rec = summarize([20.0, 21.0, 20.5, 80.0, 20.2])
    (line,) = compare_render.outlier_lines({"phases": {"step": rec}})
    assert line.endswith(f"({80.0 / 20.5:.1f}x the median)")


def test_profile_analysis_after_parity_says_each_stage(tmp_path, capsys) -> None:
    """After "[parity] finished", compare --profile analysed its profiles without a word:
    each backend's kernel breakdown, and the timeline, say what they do and when done."""
    import shutil

    from harness.runs.compare_profiles import backend_timeline, kernel_breakdown

    data = Path(__file__).parent / "data" / "torch_fallback"
    profile = data / "torch_tiny_fallback.json.gz"
    shutil.copy(data / "torch_tiny_fallback.harness.json", tmp_path / "torch.json")
    (bd,) = kernel_breakdown({"torch": str(profile)}, str(tmp_path), None).breakdowns
    assert list(bd.phases) == ["step", "forward", "backward", "optimizer"] and bd.label == "torch"
    backend_timeline({"torch": str(profile)}, [bd], 1, None, None)
    lines = capsys.readouterr().err.splitlines()
    what = f"[compare] kernel breakdown 1/1: torch ({profile.stat().st_size / 1e3:.1f} kB)"
    assert lines[0] == what
    assert lines[1].startswith(f"{what}: done in ") and lines[1].endswith(" s: phases step, forward, backward, optimizer")
    assert lines[2] == "[compare] timeline: torch on one trace" and lines[3].startswith(f"{lines[2]}: done in ")
    assert len(lines) == 4


def test_the_terminal_says_the_answer_before_the_table(capsys) -> None:
    from harness import compare

    folder = Path(__file__).parent.parent / "results" / "main-job" / "large-ctx256-bf16-h100-80gb-hbm3"
    summary = json.loads((folder / "summary.json").read_text())
    assert compare.report(summary, str(folder)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "the answer:"
    steps = {b: r["phases"]["fused_step" if "fused_step" in r["phases"] else "step"]["median_ms"]
             for b, r in summary["runs"].items()}
    fastest = min(steps, key=steps.get)
    assert lines[1].startswith(f"- {fastest} is fastest: {steps[fastest]:.1f} ms per step")
    assert lines.index("") < next(i for i, line in enumerate(lines) if line.startswith("phase "))


PROFILED_B32 = Path(__file__).resolve().parent.parent / "results" / "mfu" / "h200" / "profiled-b32"


def test_a_profiled_compare_answers_where_its_step_went_in_points_of_mfu() -> None:
    """A compare under nsys records each backend's step as points of MFU (from its kernels and
    its document) and its answer says them: the figures of the mfu-points page block for the
    same profile, summing to 100 with the MFU. A run that failed, or a profile without the
    figures, gets none."""
    from harness.diffs.throughput import MFU_PARTS
    from harness.reports.compare_answer import compare_findings
    from harness.reports.compare_folder import attach_mfu_points
    from harness.reports.doc_blocks import mfu_points_table

    folder = PROFILED_B32 / "jax-fused-norm" / "large-ctx1024-bf16-fused-h200-profiled"
    committed = json.loads((folder / "summary.json").read_text())
    summary = copy.deepcopy(committed)
    del summary["runs"]["jax"]["mfu_points"]  # as compare has it before the breakdown
    entries = json.loads((folder / "kernels.json").read_text())
    assert not any("points of 100" in f.text for f in compare_findings(summary))
    attach_mfu_points(summary, entries)
    points = summary["runs"]["jax"]["mfu_points"]
    assert points == committed["runs"]["jax"]["mfu_points"]  # what regenerate recorded from the same files
    assert points["phase"] == "fused_step" and abs(sum(points[k] for k in MFU_PARTS) - 100) < 1e-9
    (line,) = [f.text for f in compare_findings(summary) if "points of 100" in f.text]
    row = mfu_points_table([folder], folder.parents[3]).splitlines()[2].split("|")[4:9]
    assert line == ("the profiled step in points of 100: jax MFU {}, GEMMs below peak {}, attention below peak {}, "
                    "other kernels {}, GPU idle {}").format(*(c.strip() for c in row))
    failed, old, several = (copy.deepcopy(summary) for _ in range(3))
    for doc in (failed, old, several):
        del doc["runs"]["jax"]["mfu_points"]
    failed["runs"]["jax"]["status"] = "failed"
    attach_mfu_points(failed, entries)
    no_busy = [{**e, "phases": {k: {x: v for x, v in p.items() if x != "busy_ns_per_step"}
                                for k, p in e["phases"].items()}} for e in entries]
    attach_mfu_points(old, no_busy)
    several["data_parallel"] = {"n": 4, "parallel": "fsdp"}  # communication beside compute: not split
    attach_mfu_points(several, entries)
    assert not any("mfu_points" in doc["runs"]["jax"] for doc in (failed, old, several))
