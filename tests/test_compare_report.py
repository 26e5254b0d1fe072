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

from harness.timing import compare_render
from harness.timing.compare_render import NOISY_SPREAD, compare_markdown, format_table, noise_warnings, plot_phases
from harness.timing.run_render import format_result

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
