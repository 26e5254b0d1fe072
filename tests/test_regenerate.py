"""`harness.regenerate`: the committed results are what their documents render to today.

(a) --check over the real results/ passes: every generated text file is current.
(b) A copy of one committed folder of each kind with one number changed in a generated file
    fails --check, naming that file and no other.
(c) A bad --root is one line naming the option, before any work.
(e) A several-runs diff renders from the run documents in its folder, and names one it lacks.
(d) The generated block of README.md agrees with its compare folder's report; a digit changed
    inside it fails --check naming README.md, and rendering puts it back; prose outside it is
    not checked; a broken block is one line naming the page.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
import pytest

from harness import regenerate

RESULTS = Path(__file__).resolve().parent.parent / "results"
DIFF = "several-gpus/diff-large-ctx1024-bf16-ddp4-h200"
COMPARE = "several-gpus/large-ctx1024-bf16-fused-ddp4-h200-profiled"  # the compare folder the diff above reads
RUNS_DIFF = "mfu/h200/jax-before-after"  # a several-runs diff, its run documents in runs/


def test_check_passes_on_the_committed_results(capsys) -> None:
    start = time.perf_counter()
    code = regenerate.main(["--check", "--root", str(RESULTS)])
    out, err = capsys.readouterr()
    assert (code, out, err) == (0, "", "")
    assert time.perf_counter() - start < 20


def test_every_kind_is_found_in_the_committed_results() -> None:
    kinds = {kind.name for kind, _ in regenerate.targets(RESULTS)}
    assert kinds == {kind.name for kind in regenerate.KINDS}


def _plant(path: Path, old: str, new: str) -> None:
    """Replace the first `old` in the file by `new` (the one change the check must find)."""
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


# (folders to copy, the generated file to edit, a figure in it, its planted replacement)
PLANTS = {
    "compare": ([COMPARE], f"{COMPARE}/report.md", "| 32.", "| 33."),
    "sweep": (["mfu/h100"], "mfu/h100/jax/cells.csv", ",large,", ",xl,"),
    "scaling": (["several-gpus/scaling-large-ctx1024-bf16-h200x2"], "several-gpus/scaling-large-ctx1024-bf16-h200x2/scaling.md",
                "| 100.0% |", "| 100.1% |"),
    "diff": ([COMPARE, DIFF], f"{DIFF}/diff.md", "82.924 ms", "82.925 ms"),
    "attention": (["attention/hopper-h200"], "attention/hopper-h200/fa3-hd64-bf16-short.md", " | ok |", " | OOM |"),
    "tune": (["attention/tune-h200"], "attention/tune-h200/mosaic-fwd.md", "| fwd |", "| bwd |"),
    "gemms": (["gemms"], "gemms/large-ctx1024-b32-h200-1.md", "| q/k/v/o | fwd |", "| q/k/v/o | bwd |"),
}


@pytest.mark.parametrize("kind", PLANTS)
def test_check_names_the_one_edited_file(kind, tmp_path, capsys) -> None:
    folders, edited, old, new = PLANTS[kind]
    for name in folders:
        shutil.copytree(RESULTS / name, tmp_path / name)
    found = {k.name for k, _ in regenerate.targets(tmp_path)}
    assert kind in found
    assert regenerate.main(["--check", "--root", str(tmp_path)]) == 0  # the copy is current as committed
    capsys.readouterr()
    _plant(tmp_path / edited, old, new)
    code = regenerate.main(["--check", "--root", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 1
    assert [line.split(": ")[0] for line in out.splitlines()] == [str(tmp_path / edited)]
    assert (tmp_path / edited).read_text().count(new) >= 1  # --check wrote nothing


def test_render_puts_back_what_was_edited(tmp_path, capsys) -> None:
    folders, edited, old, new = PLANTS["compare"]
    shutil.copytree(RESULTS / COMPARE, tmp_path / COMPARE)
    _plant(tmp_path / edited, old, new)
    assert regenerate.main(["--root", str(tmp_path)]) == 0
    assert (tmp_path / edited).read_text() == (RESULTS / edited).read_text()
    assert regenerate.main(["--check", "--root", str(tmp_path)]) == 0


def test_a_diff_without_its_compare_folder_is_named(tmp_path, capsys) -> None:
    shutil.copytree(RESULTS / DIFF, tmp_path / DIFF)
    assert regenerate.main(["--check", "--root", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and f"its compare folder {Path(COMPARE).name} is not under {tmp_path}" in err


@pytest.mark.parametrize("place", ["beside", "elsewhere"])
def test_a_moved_diff_finds_its_compare_folder(place, tmp_path, capsys) -> None:
    """A gallery keeps a diff beside its compare folder or in another question folder: the diff
    reads the compare folder of its labels' name in either place; the planted figure is found."""
    compare = tmp_path / ("q" if place == "beside" else "other") / Path(COMPARE).name
    shutil.copytree(RESULTS / COMPARE, compare)
    shutil.copytree(RESULTS / DIFF, tmp_path / "q" / Path(DIFF).name)
    assert regenerate.main(["--check", "--root", str(tmp_path)]) == 0
    _plant(tmp_path / "q" / Path(DIFF).name / "diff.md", "82.924 ms", "82.925 ms")
    assert regenerate.main(["--check", "--root", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert err == "" and out.startswith(str(tmp_path / "q" / Path(DIFF).name / "diff.md"))


def _scale_step_times(path: Path, factor: float) -> list[float]:
    """A run document's fused-step times (and their median) times `factor`, written back; the new times."""
    run = json.loads(path.read_text())
    step = run["phases"]["fused_step"]
    step["times_ms"] = [t * factor for t in step["times_ms"]]
    step["median_ms"] = statistics.median(step["times_ms"])
    path.write_text(json.dumps(run))
    return step["times_ms"]


def test_a_several_runs_diff_renders_from_the_runs_in_its_folder(tmp_path, capsys) -> None:
    folder = tmp_path / RUNS_DIFF
    shutil.copytree(RESULTS / RUNS_DIFF, folder)
    assert regenerate.main(["--check", "--root", str(tmp_path)]) == 0
    _plant(folder / "diff.md", "302.646 ms", "302.647 ms")
    assert regenerate.main(["--check", "--root", str(tmp_path)]) == 1
    assert capsys.readouterr().out.split(": ")[0] == str(folder / "diff.md")
    # A run's step times moved in its document: the rendering moves with them (B's range now
    # starts at that run's median).
    shutil.copy(RESULTS / RUNS_DIFF / "diff.md", folder / "diff.md")
    times = _scale_step_times(folder / "runs" / "new-1.json", 0.9)
    assert regenerate.main(["--root", str(tmp_path)]) == 0
    assert f"B's 3 runs {statistics.median(times):.3f}-" in (folder / "diff.md").read_text()
    capsys.readouterr()
    (folder / "runs" / "old-1.json").unlink()
    assert regenerate.main(["--check", "--root", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "its run document runs/old-1.json is not in it" in err


ONE_RUN_DIFF = "mfu/h200/pallas-attention/b48"  # one run document a side, in its runs/


def test_a_diff_of_one_run_a_side_renders_from_the_documents_its_labels_name(tmp_path, capsys) -> None:
    folder = tmp_path / ONE_RUN_DIFF
    shutil.copytree(RESULTS / ONE_RUN_DIFF, folder)
    assert regenerate.main(["--check", "--root", str(tmp_path)]) == 0
    # B's step times moved in its document: the rendering moves with them.
    times = _scale_step_times(folder / "runs" / "pallas-1.json", 0.9)
    assert regenerate.main(["--check", "--root", str(tmp_path)]) == 1
    assert capsys.readouterr().out.split(": ")[0] == str(folder / "diff.md")
    assert regenerate.main(["--root", str(tmp_path)]) == 0
    assert f"B (pallas-1) takes {statistics.median(times):.3f} ms per fused_step" in (folder / "diff.md").read_text()
    capsys.readouterr()
    # Without the document its label names, the diff cannot be rendered: one line naming the folder.
    (folder / "runs" / "fused-1.json").unlink()
    assert regenerate.main(["--check", "--root", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and f"{folder}" in err and "names no two" in err


def test_a_diff_folder_holding_a_compare_folder_is_checked_whole(tmp_path, capsys) -> None:
    """A several-runs diff whose folder also holds a compare folder (`profiled/`): the compare
    folder is checked first, and the diff's own files must still be there to check after it."""
    name = "several-gpus/flat-state-ddp2-h200x2"
    folder = tmp_path / name
    shutil.copytree(RESULTS / name, folder, ignore=shutil.ignore_patterns("README.md"))
    assert (folder / "profiled" / "summary.json").is_file() and (folder / "diff.json").is_file()
    assert regenerate.main(["--check", "--root", str(tmp_path)]) == 0, capsys.readouterr().err
    _plant(folder / "diff.md", "68.025 ms", "68.026 ms")
    assert regenerate.main(["--check", "--root", str(tmp_path)]) == 1
    assert capsys.readouterr().out.split(": ")[0] == str(folder / "diff.md")


def test_a_diff_reads_the_compare_folders_beside_it_when_checked(tmp_path, capsys) -> None:
    """A diff folder beside its two compare folders, whose names other folders of the root share
    (`profiled-b32/jax/` holds one of them): the check reads the compare folders beside the diff,
    as the render in place does, and finds an edit planted in the diff."""
    for name in ("several-gpus/second-device-ddp2-h200x2", "mfu/h200/profiled-b32"):
        shutil.copytree(RESULTS / name, tmp_path / name, ignore=shutil.ignore_patterns("README.md"))
    diff = tmp_path / "several-gpus/second-device-ddp2-h200x2/diff/diff.md"
    assert (tmp_path / "mfu/h200/profiled-b32/jax/large-ctx1024-bf16-fused-h200-profiled/summary.json").is_file()
    assert regenerate.main(["--check", "--root", str(tmp_path)]) == 0, capsys.readouterr().err
    _plant(diff, "69.190 ms", "69.191 ms")
    assert regenerate.main(["--check", "--root", str(tmp_path)]) == 1
    assert capsys.readouterr().out.split(": ")[0] == str(diff)


@pytest.mark.parametrize("make", ["missing", "file"])
def test_bad_root_is_one_line_naming_the_option(make, tmp_path, capsys) -> None:
    root = tmp_path / "nowhere"
    if make == "file":
        root.write_text("")
    assert regenerate.main(["--root", str(root)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"error: --root {root}: ")


def test_ctrl_c_mid_render_leaves_every_file_whole(tmp_path, capsys, monkeypatch) -> None:
    """Ctrl-C after the plot is drawn and before the report is written: exit 130 in one line,
    every file as committed, no temporary file left."""
    from harness.reports import compare as compare_render

    shutil.copytree(RESULTS / COMPARE, tmp_path / COMPARE)
    before = {p.name: p.read_bytes() for p in (tmp_path / COMPARE).iterdir()}

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(compare_render, "compare_markdown", interrupted)
    assert regenerate.main(["--root", str(tmp_path)]) == 130
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "interrupted" in err
    assert {p.name: p.read_bytes() for p in (tmp_path / COMPARE).iterdir()} == before


def test_a_document_cut_short_is_named_and_the_rest_rendered(tmp_path, capsys) -> None:
    """A sweep whose sweep.json lost its keys: one line naming it; the compare beside it still checked."""
    shutil.copytree(RESULTS / COMPARE, tmp_path / COMPARE)
    shutil.copytree(RESULTS / "mfu" / "h100" / "jax", tmp_path / "sweep")
    (tmp_path / "sweep" / "sweep.json").write_text("{}")
    _plant(tmp_path / COMPARE / "report.md", "| 32.", "| 33.")
    assert regenerate.main(["--check", "--root", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[0].startswith(str(tmp_path / COMPARE / "report.md"))
    assert err.count("\n") == 1 and f"{tmp_path / 'sweep'} (sweep): cannot be rendered" in err


# -- the generated blocks of the pages beside the root (README.md, docs/) ---------------------
MAIN = "main-job/large-ctx256-bf16-h200-three-way"  # the compare folder the README's main-job block names
REPO = RESULTS.parent


def _block(text: str) -> str:
    start = text.index(f"<!-- generated: main-job {MAIN} -->")
    return text[start:text.index("<!-- end generated -->", start)]


def _repo_copy(tmp_path: Path) -> Path:
    """README.md beside a results/ holding the main job's folders (the run and its profile, which
    the README's blocks name): a repository the check reads."""
    shutil.copy(REPO / "README.md", tmp_path / "README.md")
    for folder in (MAIN, f"{MAIN}-profiled"):
        shutil.copytree(RESULTS / folder, tmp_path / "results" / folder)
    return tmp_path / "results"


def test_the_readme_block_agrees_with_the_folder_s_report() -> None:
    """Each figure of the README's table against the compare report's own table (another renderer):
    the step and fused-step medians and p10-p90, and the time to first step, rounded."""
    rows = {line.split(" | ")[0].strip("| "): line for line in _block((REPO / "README.md").read_text()).splitlines()
            if line.startswith("| ")}
    report = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in
              (RESULTS / MAIN / "report.md").read_text().splitlines() if line.startswith("| ")}
    header = report["phase"]
    col = {name: header.index(f"{name} ms (median, p10-p90)") for name in ("torch", "torch-compile", "jax")}

    def fig(text: str) -> str:  # "212.366 (187.718-222.397)" -> "212.4 187.7-222.4"
        median, spread = text.split(" (")
        lo, hi = spread.rstrip(")").split("-")
        return f"{float(median):.1f} {float(lo):.1f}-{float(hi):.1f}"

    def mine(label: str) -> str:
        cells = rows[label].strip("| ").split(" | ")
        return f"{cells[1]} {cells[2]}"

    assert mine("torch") == fig(report["step"][col["torch"]])
    assert mine("torch-compile") == fig(report["step"][col["torch-compile"]])
    assert mine("jax, split step") == fig(report["step"][col["jax"]])
    assert mine("jax, fused step") == fig(report["fused_step (torch: step)"][col["jax"]])
    firsts = report["time to first step (s)"]
    for label, name in (("torch", "torch"), ("torch-compile", "torch-compile"), ("jax, fused step", "jax")):
        assert rows[label].strip("| ").split(" | ")[5] == f"{float(firsts[col[name]]):.1f}"
    run = json.loads((RESULTS / MAIN / "summary.json").read_text())["runs"]["torch"]
    assert rows["torch"].strip("| ").split(" | ")[3] == str(len(run["phases"]["step"]["times_ms"]))
    assert f"tree {run['env']['git_commit'][:7]};" in _block((REPO / "README.md").read_text())  # git's short hash


def test_check_names_the_readme_when_a_number_in_its_block_changes(tmp_path, capsys) -> None:
    root = _repo_copy(tmp_path)
    assert regenerate.main(["--check", "--root", str(root)]) == 0  # the README as committed is current
    capsys.readouterr()
    readme = tmp_path / "README.md"
    text = readme.read_text()
    block = _block(text)
    row = next(line for line in block.splitlines() if line.startswith("| torch |"))
    planted = row.replace(row.split(" | ")[1], row.split(" | ")[1].replace(".", "1.", 1), 1)  # 212.4 -> 2121.4
    readme.write_text(text.replace(row, planted, 1))
    code = regenerate.main(["--check", "--root", str(root)])
    out, err = capsys.readouterr()
    assert (code, err) == (1, "")
    assert [line.split(": ")[0] for line in out.splitlines()] == [str(readme)]
    assert planted in readme.read_text()  # --check wrote nothing
    assert regenerate.main(["--root", str(root)]) == 0  # rendering puts the number back
    assert readme.read_text() == text


def test_text_outside_the_block_is_prose_and_left_alone(tmp_path, capsys) -> None:
    root = _repo_copy(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text().replace("## The tools", "## The tools, 42 of them", 1))
    assert regenerate.main(["--check", "--root", str(root)]) == 0


@pytest.mark.parametrize("edit", ["no end", "no folder"])
def test_a_broken_block_is_one_line_naming_the_page(edit, tmp_path, capsys) -> None:
    root = _repo_copy(tmp_path)
    readme = tmp_path / "README.md"
    text = readme.read_text()
    readme.write_text(text.replace("<!-- end generated -->", "", 1) if edit == "no end"
                      else text.replace(f"main-job {MAIN} -->", "main-job nowhere -->", 1))
    assert regenerate.main(["--check", "--root", str(root)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and f"{readme} (page)" in err


EXPOSED = "several-gpus/exposed-n4-h200"


def test_the_exposed_block_is_each_folder_s_per_device_overlap() -> None:
    """Each row of the exposed-communication block against the folder's per-device records, read
    here: the share is the mean over devices of each device's exposed time per step over the median
    of their step lengths; the folder whose settings came through XLA_FLAGS names them, and the
    folder run at the harness's defaults recorded them as compiler options."""
    from harness.reports.doc_blocks import exposed

    folders = sorted(p for p in (RESULTS / EXPOSED).iterdir() if (p / "summary.json").is_file())
    rows = {(cells[0].strip("| `"), cells[1]): cells
            for cells in (line.split(" | ") for line in exposed(folders, RESULTS).splitlines()[2:])}
    assert len(rows) == sum(len(json.loads((f / "summary.json").read_text())["overlap"]) for f in folders) >= 7
    for folder in folders:
        summary = json.loads((folder / "summary.json").read_text())
        for backend, analysis in summary["overlap"].items():
            devices = [d["per_step"] for r in analysis["ranks"] for d in r["overlap"]]
            step = "fused_step" if "fused_step" in devices[0] else "step"
            share = statistics.fmean(d[step]["exposed_ms"] for d in devices) / statistics.median(
                d[step]["step_ms"] for d in devices)
            row = rows[(folder.name, backend)]
            assert row[5] == step and row[-1].strip(" |") == f"{100 * share:.1f}%", (folder.name, backend)
    assert "16777216" in rows[("fsdp4-lhs-rs16", "jax")][3] and rows[("fsdp4-after", "jax")][3] == "-"
    after = json.loads((RESULTS / EXPOSED / "fsdp4-after" / "summary.json").read_text())["runs"]["jax"]
    assert after["env"]["compiler_options"]["xla_gpu_reduce_scatter_combine_threshold_bytes"] == 16 << 20


def test_a_block_naming_a_missing_or_extra_folder_is_one_line_naming_the_page() -> None:
    from harness.reports.doc_blocks import BlockError, render_page

    page = f"<!-- generated: exposed {EXPOSED}/ddp4 {EXPOSED}/nowhere -->\n<!-- end generated -->\n"
    with pytest.raises(BlockError, match=r"^x/README\.md: block 'exposed .*nowhere holds no compare folder"):
        render_page(page, "x/README.md", RESULTS)
    page = f"<!-- generated: main-job {MAIN} {MAIN} -->\n<!-- end generated -->\n"
    with pytest.raises(BlockError, match=r"^x/README\.md: block 'main-job .*' names 2 folders; 'main-job' takes one$"):
        render_page(page, "x/README.md", RESULTS)


PROFILED = "mfu/h200/profiled-b32"


def _profiled_rows(folders, lines):
    """Per profiled folder and its row of a generated table: the row's cells (its first three
    checked: folder, backend, step), the step's phase in kernels.json, and that phase's kernel
    time summed here by category."""
    for folder, line in zip(folders, lines[2:], strict=True):
        cells = [c.strip(" `") for c in line.strip("|").split("|")]
        (entry,) = json.loads((folder / "kernels.json").read_text())
        step = "fused_step" if "fused_step" in entry["phases"] else "step"
        p = entry["phases"][step]
        assert cells[:3] == [f"{folder.parent.name}/{folder.name}", entry["label"], step]
        per_category: dict[str, float] = {}
        for k in p["kernels"]:
            per_category[k["category"]] = per_category.get(k["category"], 0.0) + k["ns_per_step"]
        yield cells, p, per_category


def test_the_breakdown_block_is_each_profile_s_kernels_summed_by_category() -> None:
    """Each row of the breakdown block against the folder's kernels.json, summed here kernel by
    kernel, and its GEMM throughput against the matmul FLOPs of `large` counted from its shapes:
    per token, 2 FLOPs per weight of the four attention projections, the three FFN matrices and
    the head, three passes a training step."""
    from harness.reports.doc_blocks import breakdown

    folders = sorted((RESULTS / PROFILED).glob("*/*-profiled"))
    lines = breakdown(folders, RESULTS).splitlines()
    assert len(folders) == 4 and len(lines) == 6
    for cells, p, per_category in _profiled_rows(folders, lines):
        gemm = per_category["gemm"]
        assert cells[5] == f"{gemm / 1e6:.1f} ({100 * gemm / p['gpu_ns_per_step']:.1f}%)"
        assert cells[6].startswith(f"{per_category['fused_attention'] / 1e6:.1f} (")
        d, f, layers, vocab, tokens = 1280, 5120, 36, 10_000, 32 * 1024
        flops = 3 * 2 * tokens * (layers * (4 * d * d + 3 * d * f) + d * vocab)
        assert cells[-1] == f"{flops / gemm / 1e3:.0f} ({100 * flops / gemm / 1e3 / 989:.0f}%)"
        # the GPU's busy time is the union of its kernels' intervals: no more than their sum
        assert p["busy_ns_per_step"] <= p["gpu_ns_per_step"] * (1 + 1e-9)
        assert cells[4] == f"{100 * p['busy_ns_per_step'] / p['range_ns_per_step']:.1f}%"


def test_the_mfu_points_block_splits_each_profiled_step_into_its_mfu_and_what_costs_it() -> None:
    """Each row of the mfu-points block against the folder's kernels.json summed here kernel by
    kernel and the FLOPs of `large` at batch 32, ctx 1024 counted from its shapes: the MFU is
    the step's FLOPs at the H200's dense bf16 peak over the profiled step; GEMMs and attention
    lose their time beyond their own FLOPs at the peak (the attention products, full T x T,
    to the fused kernels); every other kernel loses all of its time; so does the GPU's idle
    time. The points sum to 100, up to each cell's rounding."""
    from harness.reports.doc_blocks import mfu_points_table

    folders = sorted((RESULTS / PROFILED).glob("*/*-profiled"))
    lines = mfu_points_table(folders, RESULTS).splitlines()
    assert len(lines) == 2 + len(folders) == 6
    d, f, layers, vocab, batch, ctx, peak = 1280, 5120, 36, 10_000, 32, 1024, 989.4e12
    gemm_flops = 3 * 2 * batch * ctx * (layers * (4 * d * d + 3 * d * f) + d * vocab)
    attention_flops = 3 * layers * 2 * (2 * batch * ctx * ctx * d)
    for cells, p, per_category in _profiled_rows(folders, lines):
        step_s, gemm_s, attention_s = (p["range_ns_per_step"] / 1e9, per_category["gemm"] / 1e9,
                                       per_category["fused_attention"] / 1e9)
        other_s = sum(per_category.values()) / 1e9 - gemm_s - attention_s
        want = [(gemm_flops + attention_flops) / peak / step_s, (gemm_s - gemm_flops / peak) / step_s,
                (attention_s - attention_flops / peak) / step_s, other_s / step_s,
                (p["range_ns_per_step"] - p["busy_ns_per_step"]) / 1e9 / step_s]
        got = [float(c) for c in cells[3:]]
        np.testing.assert_allclose(got[:5], [100 * w for w in want], atol=0.05 + 1e-9)
        assert abs(sum(got) - 100) <= 0.05 * len(got)
    # JAX's fused step after the fused norm: fewer points in kernels other than GEMMs and attention
    other = {line.split("|")[1].strip(" `").split("/")[0]: float(line.split("|")[7]) for line in lines[2:]}
    assert other["jax-fused-norm"] < other["jax"]


def test_an_mfu_points_block_of_a_report_without_busy_time_says_so() -> None:
    from harness.reports.doc_blocks import BlockError, render_page

    page = "<!-- generated: mfu-points ctx1024/large-ctx1024-bf16-fused-h100-80gb-hbm3-profiled -->\n<!-- end generated -->\n"
    with pytest.raises(BlockError, match=r"has no GPU busy time per step \(written before reports kept it\): "
                                         r"profile the step again"):
        render_page(page, "x/README.md", RESULTS)


def test_a_breakdown_of_an_unprofiled_compare_says_so_in_one_line() -> None:
    from harness.reports.doc_blocks import BlockError, render_page

    page = f"<!-- generated: breakdown {MAIN} -->\n<!-- end generated -->\n"
    with pytest.raises(BlockError, match=r"^x/README\.md: block 'breakdown .*has no kernels\.json: profile it "):
        render_page(page, "x/README.md", RESULTS)


def test_hopper_targets_block_renders_the_verdicts_of_a_folder_of_runs(tmp_path) -> None:
    """A page's `hopper-targets` block gives the Hopper targets' verdicts over the bench runs in a
    folder, a cell in two runs taken from the later by name; a folder with none is one line."""
    from harness.reports.doc_blocks import BlockError, render_page

    def row(impl, seq, fwd, bwd, batch=1, heads=16):
        return {"impl": impl, "dtype": "bfloat16", "head_dim": 64, "seq": seq, "causal": True, "status": "ok",
                "batch": batch, "heads": heads, "fwd_ms": fwd, "bwd_ms": bwd, "fwd_bwd_ms": fwd + bwd}

    runs = tmp_path / "att"
    runs.mkdir()
    (runs / "a.json").write_text(json.dumps({"environment": {}, "results": [
        row("pallas_mosaic", 4096, 9.0, 9.0), row("jax_cudnn", 4096, 1.0, 1.0)]}))
    (runs / "b.json").write_text(json.dumps({"environment": {}, "results": [  # replaces a.json's cell
        row("pallas_mosaic", 4096, 1.0, 2.2), row("jax_cudnn", 4096, 1.1, 2.0),
        row("pallas_mosaic", 16384, 1.0, 2.8, batch=16, heads=1), row("torch_sdpa_cudnn", 16384, 1.2, 2.8,
                                                                        batch=16, heads=1)]}))
    (runs / "notes.json").write_text(json.dumps({"not": "a run"}))
    page = "# x\n<!-- generated: hopper-targets att -->\nstale\n<!-- end generated -->\n"
    text = render_page(page, "x/README.md", tmp_path)
    # 4096: fwd 1.1/1.0 meets, fwd+bwd 3.1/3.2 misses; leaderboard: fwd 1.2/1.0, fwd+bwd 4.0/3.8 meet.
    assert "- forward and forward+backward each >= 1.0x the fastest reference: 3 of 4 cell-passes\n" in text
    assert "- the backward alone >= 1.0x: 1 of 2 cells\n" in text  # 4096: 2.0/2.2; leaderboard 2.8/2.8
    assert "forward+backward: 3.80 ms, 0.950x the time of the fastest reference (torch_sdpa_cudnn 4.00 ms); " \
           "target <= 0.95x: met" in text
    assert "- below: backward of 1x16x4096x64 (0.909x below); forward+backward of 1x16x4096x64 (0.969x below)" in text
    assert "From `a.json`, `b.json`;" in text and "stale" not in text
    (tmp_path / "empty").mkdir()
    with pytest.raises(BlockError, match=r"^x/README\.md: block 'hopper-targets empty': .*empty holds no "
                                         r"harness\.bench_attention runs"):
        render_page("<!-- generated: hopper-targets empty -->\n<!-- end generated -->\n", "x/README.md", tmp_path)


def test_runs_block_gives_one_row_per_run_document(tmp_path) -> None:
    """A page's `runs` block: one row per harness.run document of a folder (a real run of the
    fused step at batch 32 on an H200, the same run as a failure, torch-compile at batch 48), other JSON
    left out."""
    from harness.reports.doc_blocks import BlockError, render_page

    runs = tmp_path / "r"
    runs.mkdir()
    real = json.loads((RESULTS / "mfu/h200/fused-norm-before-after/runs/new-1.json").read_text())
    (runs / "a.json").write_text(json.dumps(real))
    failed = {**real, "status": "oom", "error": {"phase": "fused_step", "message": "out of memory"}, "phases": {}}
    (runs / "b.json").write_text(json.dumps(failed))
    torch = json.loads((RESULTS / "mfu/h200/torch-compile-larger-batches/b48.json").read_text())
    (runs / "c.json").write_text(json.dumps(torch))
    (runs / "notes.json").write_text(json.dumps({"not": "a run"}))
    text = render_page("# x\n<!-- generated: runs r -->\nstale\n<!-- end generated -->\n", "x/README.md", tmp_path)
    # the document's fused step: median 399.227 ms, p10 387.935, p90 405.469, MFU 0.5232, peak 75,017 MiB
    assert "| `a.json` | jax | 32 | fused_step | 399.2 | 387.9-405.5 | 10 | 52.3% | 73.3 |" in text
    assert "| `b.json` | jax | 32 | oom: out of memory | - | - | - | - | - |" in text
    # torch's step has no peak of its own: the backward's 119,211,749,888 bytes, the largest phase's
    assert "| `c.json` | torch-compile | 48 | step | 621.6 | 607.7-630.3 | 10 | 50.4% | 111.0 |" in text
    assert "notes.json" not in text and "stale" not in text
    (tmp_path / "empty").mkdir()
    with pytest.raises(BlockError, match=r"^x/README\.md: block 'runs empty': .*empty holds no harness\.run documents"):
        render_page("<!-- generated: runs empty -->\n<!-- end generated -->\n", "x/README.md", tmp_path)


def test_best_mfu_block_takes_the_median_over_a_cell_s_runs_not_the_best_run(tmp_path) -> None:
    """The `best-mfu` block over real runs: JAX's fused step at batch 48 on an H200, three runs in
    one folder and one in another (MFU 52.3%, 52.6%, 52.6%, 53.0%: median 52.6%); a batch-40 cell
    whose best run (54.0%) beats every batch-48 run but whose median (51.0%) does not; the same
    options under another XLA_FLAGS as a cell of its own, and a run that ran out of memory."""
    from harness.reports.doc_blocks import render_page

    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    for i in (1, 2, 3):
        shutil.copy(RESULTS / f"mfu/h200/jax-larger-batches/flat-state/b48-{i}.json", one / f"b48-{i}.json")
    shutil.copy(RESULTS / "mfu/h200/cublas-gemm/b48/runs/triton-1.json", two / "b48-4.json")
    shutil.copy(RESULTS / "mfu/h200/cublas-gemm/b48/runs/cublas-1.json", two / "oom.json")
    base = json.loads((one / "b48-1.json").read_text())
    for i, mfu in enumerate((0.54, 0.51, 0.51)):
        doc = json.loads(json.dumps(base))
        doc["options"]["batch"] = 40
        doc["phases"]["fused_step"]["mfu"] = mfu
        (two / f"b40-{i}.json").write_text(json.dumps(doc))
    flagged = json.loads(json.dumps(base))
    flagged["env"]["settings"]["XLA_FLAGS"] = "--xla_gpu_enable_triton_gemm=false"
    (two / "flagged.json").write_text(json.dumps(flagged))
    unknown = json.loads(json.dumps(base))  # a device whose peak the harness does not know: no MFU
    unknown["options"]["batch"] = 2
    unknown["phases"]["fused_step"]["mfu"] = None
    (two / "no-peak.json").write_text(json.dumps(unknown))
    text = render_page("<!-- generated: best-mfu one two -->\n<!-- end generated -->\n", "x/README.md", tmp_path)
    assert "- jax on one NVIDIA H200: 52.6% at `large`, ctx 1024, bf16, fused attention, batch 48 (defaults; the median of 4 runs, " \
           "52.3%-53.0%)\n" in text
    rows = [line for line in text.splitlines() if line.startswith("| jax |")]
    assert rows[0] == "| jax | `large`, ctx 1024, bf16, fused attention | 2 | defaults | - | no MFU recorded | - | - | - | `two/` |"
    assert rows[1].startswith("| jax | `large`, ctx 1024, bf16, fused attention | 40 | defaults | fused_step | 3 | 51.0% (51.0%-54.0%) |")
    assert rows[2].startswith("| jax | `large`, ctx 1024, bf16, fused attention | 48 | defaults | fused_step | 4 | 52.6% (52.3%-53.0%) | 595.9 (591.4-599.3) |")
    assert "| 4d4fa2e (3), 1e1d350 | `one/`, `two/` |" in rows[2]
    assert rows[3].startswith("| jax | `large`, ctx 1024, bf16, fused attention | 48 | XLA_FLAGS=--xla_gpu_enable_triton_gemm=false | fused_step | 1 (and 1 oom) "
                              "| 52.3% | 599.3 |")
    assert len(rows) == 4


def test_why_block_gives_each_pair_s_largest_causes_as_harness_diff_wrote_them(tmp_path) -> None:
    """The `why` block over the committed profiled main job recomputes each pair's decomposition;
    its cause sentences must be those of the committed `diff.md` that `python -m harness.diff`
    wrote for the pair, and a compare folder that was not profiled is refused in one line."""
    from harness.reports.doc_blocks import BlockError, render_page

    profiled = "main-job/large-ctx256-bf16-h200-three-way-profiled"
    text = render_page(f"<!-- generated: why {profiled} -->\n<!-- end generated -->\n", "x/README.md", RESULTS)
    lines = [line for line in text.splitlines() if line.startswith("- **")]
    assert [line.split(" (B) against ")[0] for line in lines] == ["- **torch-compile**", "- **jax**", "- **jax**"]
    diffs = RESULTS / "main-job/diff-large-ctx256-bf16-h200"
    name = "large-ctx256-bf16-h200-three-way-profiled"
    for line, (a, b) in zip(lines, [("torch", "torch-compile"), ("torch", "jax"), ("torch-compile", "jax")]):
        committed = (diffs / f"{name}-{a}-vs-{name}-{b}" / "diff.md").read_text()
        assert f"**{b}** (B) against **{a}** (A): " in line
        causes = line.split("beyond the noise. ", 1)[1]
        first, second = causes.split(". ", 1)
        assert f"- {first}.\n" in committed and f"- {second}\n" in committed
    # diff.md's headline for torch -> jax: its ratio and gap, as the block's second line gives them
    torch_jax = (diffs / f"{name}-torch-vs-{name}-jax" / "diff.md").read_text()
    headline = re.search(r"\): (\d+\.\d\dx (?:faster|slower) \([\d.]+% (?:less|more) time, [\d.]+ ms\))", torch_jax)
    assert headline and f"(A): {headline.group(1)} per step" in lines[1]
    with pytest.raises(BlockError, match=r"^x/README\.md: block 'why main-job/large-ctx256-bf16-h200-three-way': "
                                         r".* no profile to decompose"):
        render_page("<!-- generated: why main-job/large-ctx256-bf16-h200-three-way -->\n<!-- end generated -->\n",
                    "x/README.md", RESULTS)


def test_answer_block_quotes_a_report_s_answer(tmp_path) -> None:
    """The `answer` block quotes the committed sweep report's answer section (its bullets, the
    "see:" pointers naming the report), a report with no such section by its first paragraph
    (the scaling repeats), and refuses what is no report in one line."""
    from harness.reports.doc_blocks import BlockError, render_page

    def block(arg: str, root: Path = RESULTS) -> str:
        return render_page(f"<!-- generated: answer {arg} -->\n<!-- end generated -->\n", "x/README.md", root)

    text = block("sweep/h200/report.md")
    report = (RESULTS / "sweep/h200/report.md").read_text()
    bullets = [line for line in report.split("## The answer", 1)[1].split("Rules:", 1)[0].splitlines() if line]
    quoted = [line for line in text.splitlines() if line.startswith("- ")]
    assert len(quoted) == len(bullets) > 0
    assert quoted[0] == bullets[0].replace("(see: Phase times)", "(`sweep/h200/report.md`: Phase times)")
    assert "(From `sweep/h200/report.md`.)" in text
    repeats = "several-gpus/scaling-large-ctx1024-bf16-h200x4/repeats.md"
    first = (RESULTS / repeats).read_text().split("\n\n", 1)[0]
    assert block(repeats).startswith(f"<!-- generated: answer {repeats} -->\n{first}\n\n(From `{repeats}`.)")
    with pytest.raises(BlockError, match=r"^x/README\.md: block 'answer sweep/h200': .* is no report \(\.md\)"):
        block("sweep/h200")
    (tmp_path / "empty.md").write_text("# Only a title\n")
    with pytest.raises(BlockError, match=r"empty\.md opens with no answer"):
        block("empty.md", tmp_path)


def test_parity_block_gives_each_document_s_verdict() -> None:
    """The `parity` block over the committed parity documents: each one's tensor count and the
    tensor closest to its bound, read back from the document's rows here."""
    from harness.reports.doc_blocks import render_page

    text = render_page("<!-- generated: parity parity -->\n<!-- end generated -->\n", "x/README.md", RESULTS)
    for path in sorted((RESULTS / "parity").glob("*.json")):
        rows = json.loads(path.read_text())["rows"]
        assert all(r["rel_err"] <= r["tol"] for r in rows)
        closest = max(rows, key=lambda r: r["rel_err"] / r["tol"])
        line = next(line for line in text.splitlines() if line.startswith(f"- `{path.name}`: "))
        assert line.endswith(f"PASS: all {len(rows)} tensors within their bounds; the closest to its bound: jax "
                             f"{closest['quantity']} {closest['tensor']}, {closest['rel_err']:.1e} against "
                             f"{closest['tol']:.0e}")


def test_best_mfu_block_keeps_data_parallel_cells_apart_and_says_per_device(tmp_path) -> None:
    """JAX at batch 4 per device on two H200s: one device (two runs, MFU 44.05% and 44.29%), both
    devices replicated (three runs, 38.34-38.47%) and with sharded parameters (one run, 35.2%).
    Each device count is a cell and a line of its own, the data-parallel ones per device."""
    from harness.reports.doc_blocks import render_page

    runs = "several-gpus/flat-state-ddp2-h200x2/runs"
    text = render_page(f"<!-- generated: best-mfu {runs} -->\n<!-- end generated -->\n", "x/README.md", RESULTS)
    lines = [line for line in text.splitlines() if line.startswith("- ")]
    assert lines == [
        "- jax on one NVIDIA H200: 44.2% at `large`, ctx 1024, bf16, fused attention, batch 4 (defaults; the median of 2 runs, 44.0%-44.3%)",
        "- jax on 2 x NVIDIA H200 (replicated), per device: 38.4% at `large`, ctx 1024, bf16, fused attention, batch 4 (defaults; "
        "the median of 3 runs, 38.3%-38.5%)"]
    rows = [line for line in text.splitlines() if line.startswith("| jax |")]
    assert [row.split(" | ")[1] for row in rows] == [
        "`large`, ctx 1024, bf16, fused attention", "`large`, ctx 1024, bf16, fused attention, 2 devices, replicated",
        "`large`, ctx 1024, bf16, fused attention, 2 devices, sharded parameters, collectives merged"]
    assert "| 1 | 35.2% | 74.2 |" in rows[2]


def test_best_mfu_block_keeps_attention_and_nccl_settings_apart(tmp_path) -> None:
    """Two H200s, replicated, batch 4 per device: two runs with NCCL's own protocol and two with
    `NCCL_PROTO=Simple` (its rows' settings; the machine's `NCCL_NVLS_ENABLE=0` is not one), and
    three with the Pallas attention in place of cuDNN's, each a cell of its own that says so."""
    from harness.reports.doc_blocks import render_page

    runs = tmp_path / "runs"
    runs.mkdir()
    for path in (RESULTS / "several-gpus/flat-state-ddp2-h200x2/nccl-simple").glob("*.json"):
        shutil.copy(path, runs / path.name)
    for path in (RESULTS / "several-gpus/pallas-per-device-ddp2-h200x2/runs").glob("b-*.json"):
        shutil.copy(path, runs / path.name)
    text = render_page("<!-- generated: best-mfu runs -->\n<!-- end generated -->\n", "x/README.md", tmp_path)
    rows = [line.split(" | ")[1:7] for line in text.splitlines() if line.startswith("| jax |")]
    cell = "`large`, ctx 1024, bf16, {} attention, 2 devices, replicated"
    assert [(r[0], r[2], r[4]) for r in rows] == [(cell.format("fused"), "defaults", "2"),
                                                  (cell.format("fused"), "NCCL_PROTO=Simple", "2"),
                                                  (cell.format("pallas"), "defaults", "3")]
    assert "NCCL_NVLS_ENABLE" not in text


def test_best_mfu_block_names_the_memory_pool_a_batch_needed(tmp_path) -> None:
    """JAX at batch 56 and 64 with XLA's client pool raised to 95% of the GPU's memory (they do not
    fit in its default 75%) and at batch 48 without: the larger batches' rows name the setting, the
    batch-48 row's says defaults."""
    from harness.reports.doc_blocks import render_page

    runs = tmp_path / "runs"
    runs.mkdir()
    for path in [*(RESULTS / "mfu/h200/jax-larger-batches/mem-fraction").glob("*.json"),
                 *(RESULTS / "mfu/h200/jax-larger-batches/tree-1eb194e").glob("*.json")]:
        shutil.copy(path, runs / path.name)
    text = render_page("<!-- generated: best-mfu runs -->\n<!-- end generated -->\n", "x/README.md", tmp_path)
    rows = [line.split(" | ")[2:4] for line in text.splitlines() if line.startswith("| jax |")]
    assert rows == [["48", "defaults"], ["56", "XLA_PYTHON_CLIENT_MEM_FRACTION=0.95"],
                    ["64", "XLA_PYTHON_CLIENT_MEM_FRACTION=0.95"]]


def test_a_diff_of_two_compare_folders_of_one_name_reads_each(tmp_path, capsys) -> None:
    """A profiled diff of one cell's compare folders from two gallery folders: its labels name
    the folders that tell them apart, and the check reads each side from its own folder (the
    figures of both sides are in the diff, and an edit planted in it is found)."""
    after, before = "several-gpus/flat-allreduce-ddp2-h200x2", "several-gpus/second-device-ddp2-h200x2"
    for name in (after, before):
        shutil.copytree(RESULTS / name, tmp_path / name, ignore=shutil.ignore_patterns("README.md"))
    diff = tmp_path / after / "profiled-diff" / "diff.json"
    labels = [json.loads(diff.read_text())[k] for k in ("a_label", "b_label")]
    assert [label.split("/")[0] for label in labels] == [Path(before).name, Path(after).name]
    assert regenerate.main(["--check", "--root", str(tmp_path)]) == 0, capsys.readouterr().err
    _plant(diff.with_name("diff.md"), "69.190 ms", "69.191 ms")
    assert regenerate.main(["--check", "--root", str(tmp_path)]) == 1
    assert capsys.readouterr().out.split(": ")[0] == str(diff.with_name("diff.md"))


def test_tune_speedups_block_sets_each_candidate_against_its_faster_default(tmp_path) -> None:
    """A page's `tune-speedups` block: per search in a folder, each candidate's median against the
    faster of the default's two measurements on the same shape, their repeats' ranges, and
    whether the candidate's range lies below both of the default's. The real leaderboard search
    of the launch order, and the same with the candidate's repeats moved below the defaults'."""
    from harness.reports.doc_blocks import BlockError, render_page

    folder = tmp_path / "t"
    folder.mkdir()
    lines = (RESULTS / "attention/tune-h200/launch-order/leaderboard-tiles-first.jsonl").read_text().splitlines()
    (folder / "a.jsonl").write_text("\n".join(lines) + "\n")
    rows = [json.loads(line) for line in lines if '"environment"' not in line]
    default = min((r for r in rows if r["candidate"] in ("default", "default (again)")), key=lambda r: r["ms"])
    cand = next(r for r in rows if r["candidate"] not in ("default", "default (again)"))
    assert default["ms"] == pytest.approx(3.140, abs=5e-4) and cand["ms"] == pytest.approx(3.033, abs=5e-4)
    moved = [{**r, "ms_spread": [2.9, 3.0]} if r is cand else r for r in rows]
    (folder / "b.jsonl").write_text("\n".join([lines[0], *map(json.dumps, moved)]) + "\n")
    text = render_page("<!-- generated: tune-speedups t -->\nstale\n<!-- end generated -->\n", "x/README.md", tmp_path)
    low, high = default["ms_spread"]
    shape = f"| bwd | 16 x 1 x 16384 x 64 | yes | {cand['candidate']} | {default['ms']:.3f} ({low:.3f}-{high:.3f})"
    spread = "({:.3f}-{:.3f})".format(*cand["ms_spread"])
    # its repeats reach 3.184, above both defaults' lowest (3.101, 3.083)
    assert f"| `a` {shape} | {cand['ms']:.3f} {spread} | 1.035x | no |" in text
    assert f"| `b` {shape} | {cand['ms']:.3f} (2.900-3.000) | 1.035x | yes |" in text
    assert "stale" not in text
    # A search that recorded no ranges (older ones did not) gives its medians alone.
    (folder / "b.jsonl").unlink()
    bare = [{k: v for k, v in r.items() if k != "ms_spread"} for r in rows]
    (folder / "a.jsonl").write_text("\n".join([lines[0], *map(json.dumps, bare)]) + "\n")
    text = render_page("<!-- generated: tune-speedups t -->\n<!-- end generated -->\n", "x/README.md", tmp_path)
    assert f"| {default['ms']:.3f} | {cand['ms']:.3f} | 1.035x | no |" in text
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "c.jsonl").write_text("\n".join(line for line in lines if cand["candidate"] not in line) + "\n")
    with pytest.raises(BlockError, match=r"^x/README\.md: block 'tune-speedups d': .*no search with a candidate"):
        render_page("<!-- generated: tune-speedups d -->\n<!-- end generated -->\n", "x/README.md", tmp_path)
