"""Report rendering end to end on the captured profiles, and the CLI's failure path."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from harness import report
from harness.reports import breakdown as render
from harness.trace.analyses.breakdown import breakdown, load_profile

DATA = Path(__file__).parent / "data"
TORCH = DATA / "torch_small_train" / "torch_small_train.sqlite.gz"
JAX = DATA / "jax_small_train" / "jax_small_train.sqlite.gz"


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report")
    code = report.main([str(TORCH), str(JAX), "--out", str(out),
                        "--harness-json", str(TORCH.parent / "torch_small_train.harness.json"),
                        "--harness-json", str(JAX.parent / "jax_small_train.harness.json")])
    assert code == 0
    return out


def test_files_written(written: Path) -> None:
    for ext in ("md", "csv", "json", "png"):
        assert (written / f"kernels.{ext}").stat().st_size > 0
    assert (written / "kernels.png").read_bytes()[:4] == b"\x89PNG"


def test_markdown_side_by_side(written: Path) -> None:
    md = (written / "kernels.md").read_text()
    assert "| phase | metric | torch | jax |" in md
    assert "harness timer" in md  # (a) used the harness JSON
    for question in ("(a)", "(b)", "(c)", "(d)"):
        assert question in md
    assert "GEMM kernels decoded" in md


def test_json_numbers_consistent(written: Path) -> None:
    doc = json.loads((written / "kernels.json").read_text())
    assert [d["label"] for d in doc] == ["torch", "jax"]
    for bd in doc:
        phases = bd["phases"]
        for p in phases.values():
            assert p["gpu_ns_per_step"] > 0 and p["kernels_per_step"] > 0
            assert sum(p["categories"].values()) == pytest.approx(p["gpu_ns_per_step"])
            assert sum(k["share"] for k in p["kernels"]) == pytest.approx(1.0)
        parts = sum(phases[n]["gpu_ns_per_step"] for n in ("forward", "backward", "optimizer"))
        assert parts <= phases["step"]["gpu_ns_per_step"] * (1 + 1e-9)
        a = bd["answers"]["a"]
        assert a["reference"] == "harness timer" and a["reference_ms"] > 0


def test_csv_rows_match_json(written: Path) -> None:
    rows = list(csv.DictReader(open(written / "kernels.csv")))
    doc = json.loads((written / "kernels.json").read_text())
    assert len(rows) == sum(len(p["kernels"]) for bd in doc for p in bd["phases"].values())
    torch_fwd = [r for r in rows if r["label"] == "torch" and r["phase"] == "forward"]
    assert sum(float(r["share"]) for r in torch_fwd) == pytest.approx(1.0)


def test_render_markdown_for_the_compare_report() -> None:
    bds = [breakdown(load_profile(TORCH, label="pytorch"))]
    md = render.breakdown_markdown(bds, title="Kernels")
    assert md.startswith("# Kernels") and "pytorch" in md


def test_short_name() -> None:
    name = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
            "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)")
    assert render.short_name(name, 200) == ("at::native::vectorized_elementwise_kernel<4, "
                                            "at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >")


@pytest.mark.parametrize("make,needle", [
    (lambda d: d / "missing.sqlite", "no such file"),
    (lambda d: d / "notes.txt", "not a profile"),
])
def test_cli_failures_are_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture, make, needle: str) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    assert report.main([str(make(tmp_path)), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_cli_missing_range(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert report.main([str(TORCH), "--require", "fused_step", "--out", str(tmp_path)]) == 2
    assert "no range named 'fused_step'" in capsys.readouterr().err


def test_memcpy_text_matches_the_tables(written: Path) -> None:
    """JAX's forward ranks `[CUDA memcpy]` among its kernels and counts it in GPU ms: the
    text must say so, not that copies are counted apart."""
    md = (written / "kernels.md").read_text()
    doc = json.loads((written / "kernels.json").read_text())
    fwd = doc[1]["phases"]["forward"]
    copies = [k for k in fwd["kernels"] if k["name"].startswith("[CUDA mem")]
    assert copies and sum(fwd["categories"].values()) == pytest.approx(fwd["gpu_ns_per_step"])
    assert "counted apart" not in md
    assert "GPU ms = sum of the durations of the kernels, memcpys and memsets" in md


def test_range_inferred_categories_are_listed_once(written: Path) -> None:
    """One line per (profile, range, category), naming the kernels, not one per kernel and phase."""
    md = (written / "kernels.md").read_text()
    lines = [line for line in md.splitlines() if "inside `optimizer` are optimizer" in line]
    assert len(lines) == len(set(lines)) and 1 <= len(lines) <= 2
    assert not any("- ..." in line for line in md.splitlines())


def test_gemm_caption_reads_each_transpose_on_its_own() -> None:
    """Forward `nn` and `tn` together: not "weights stored [out, in]" for both."""
    from harness.trace.kernels import decode_gemm
    from harness.trace.stats import Breakdown, KernelStat, PhaseStats

    names = ("cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_nn_align1",
             "cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_tn_align1")
    kernels = [KernelStat(n, "gemm", 1.0, 1.0, 1.0, 0.5, decode_gemm(n)) for n in names]
    fwd = PhaseStats("forward", "step", 1, 1, 2.0, 2.0, 2.0, {"gemm": 2.0}, kernels)
    caption = render._caption(Breakdown("x", "nsys", "x", {"forward": fwd}, *[None] * 3, [], []))
    assert "`nn` (weights stored [in, out], or P V)" in caption
    assert "`tn` (weights stored [out, in], or Q K^T)" in caption
    assert "i.e. weights stored" not in caption


def test_a_long_report_says_what_it_is_doing(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    """`report` on an HTA trace printed nothing for 90 s: each stage that runs long says what
    it does (reading, with the file's size; analysing, with the profile's counts; writing and
    drawing) on stderr, and when done, what it found. Stages made to count as long at once here."""
    import gzip

    from harness.common import progress

    monkeypatch.setattr(progress, "AFTER_S", 0.0)
    monkeypatch.setattr(progress, "EVERY_S", 600.0)  # no "so far" lines in between
    trace = DATA / "hta" / "sampled_rank-0.json.gz"
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    activities = sum(e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") for e in events if e.get("ph") == "X")
    from harness.trace.sources.load import load_profile

    ranges = len(load_profile(trace).ranges)  # the program's and the libraries' ranges the reader keeps
    assert report.main([str(trace), "--out", str(tmp_path), "--no-plot"]) == 0
    captured = capsys.readouterr()
    said = captured.err.splitlines()
    assert all(line.startswith("[trace] ") for line in said[:4]) and all(x.startswith("[report] ") for x in said[4:])
    said = [line.split("] ", 1)[1] for line in said]  # the trace library reads and analyses, the tool writes
    assert said[0] == f"reading sampled_rank-0.json.gz ({trace.stat().st_size / 1e3:.1f} kB)"
    assert said[1].startswith(f"{said[0]}: done in ") and said[1].endswith(f" s: {activities:,} GPU activities, "
                                                                            f"{ranges} ranges")
    assert said[2] == f"analysing sampled_rank-0 ({activities:,} GPU activities, {ranges} ranges)"
    assert [s.split(": done in ")[0] for s in said[3:]] == [said[2], "writing kernels.md, .csv, .json",
                                                            "writing kernels.md, .csv, .json", "writing report.html",
                                                            "writing report.html"]
    assert "[report]" not in captured.out and "[trace]" not in captured.out


def test_progress_speaks_only_for_long_work(monkeypatch, capsys: pytest.CaptureFixture) -> None:
    """A stage says nothing when it ends before AFTER_S (tests and small inputs stay quiet, a
    failure keeps its one line); past it, what it does, how long so far every EVERY_S, and
    at the end how long it took and what it found; a stage that fails says no "done"."""
    import time

    from harness.common import progress

    with progress.stage("t", "quick") as found:
        found("nothing")
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress, "AFTER_S", 0.05)
    monkeypatch.setattr(progress, "EVERY_S", 0.05)
    with progress.stage("t", "slow work (3 files)") as found:
        time.sleep(0.4)
        found("42 kernels")
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "[t] slow work (3 files)" and lines[1].endswith(" s so far") and len(lines) >= 4
    assert lines[-1].startswith("[t] slow work (3 files): done in 0.") and lines[-1].endswith(" s: 42 kernels")
    with pytest.raises(ValueError), progress.stage("t", "failing"):
        time.sleep(0.2)
        raise ValueError
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "[t] failing" and not any("done" in line for line in lines)
