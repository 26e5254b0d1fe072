"""Profiles of programs the harness did not write (tests/data/user_loops): per-step figures
against hand counts made with SQL on the same export, not through the code under test."""

from __future__ import annotations

import gzip
import sqlite3
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from harness import report
from harness.reports import breakdown as render
from harness.trace.analyses.breakdown import breakdown, load_profile
from harness.trace.kernels import Category
from harness.trace.profile import Kernel, Profile, Range

LOOPS = Path(__file__).parent / "data" / "user_loops"
GPU_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory):
    """name -> an open connection to the unpacked export."""
    out, opened = tmp_path_factory.mktemp("loops"), {}

    def open_(name: str) -> sqlite3.Connection:
        if name not in opened:
            path = out / f"{name}.sqlite"
            path.write_bytes(gzip.decompress((LOOPS / f"{name}.sqlite.gz").read_bytes()))
            opened[name] = sqlite3.connect(path)
        return opened[name]

    return open_


def _ranges(con: sqlite3.Connection, name: str) -> list[tuple[int, int]]:
    return con.execute("SELECT n.start, n.end FROM NVTX_EVENTS n LEFT JOIN StringIds s ON n.textId = s.id "
                       "WHERE COALESCE(n.text, s.value) = ? AND n.eventType = 59 ORDER BY n.start", (name,)).fetchall()


def _inside(con: sqlite3.Connection, spans: list[tuple[int, int]], tables=GPU_TABLES) -> tuple[int, int]:
    """(records, ns) of GPU records whose execution lies inside one of `spans`."""
    n = ns = 0
    for table in tables:
        for lo, hi in spans:
            c, t = con.execute(f"SELECT COUNT(*), COALESCE(SUM(end - start), 0) FROM {table} "
                               "WHERE start >= ? AND end <= ?", (lo, hi)).fetchone()
            n, ns = n + c, ns + t
    return n, ns


@pytest.mark.parametrize("phase", ["train_step", "forward", "backward", "optimizer"])
def test_torch_loop_without_warmup_range_matches_hand_count(db, phase: str) -> None:
    con = db("torch_loop")
    bd = breakdown(load_profile(LOOPS / "torch_loop.sqlite.gz"))
    assert "first of 6 `train_step`" in bd.steady_rule
    p = bd.phases[phase]
    steady = _ranges(con, phase)[1:]  # the first step (allocation, cuBLAS handles) is set apart
    assert p.steps == len(steady) == 5
    _, ns = _inside(con, steady)
    kernels, _ = _inside(con, steady, GPU_TABLES[:1])
    assert p.gpu_ns_per_step == pytest.approx(ns / 5)
    assert p.kernels_per_step == pytest.approx(kernels / 5)  # memcpys and memsets counted apart
    first_records, first_ns = _inside(con, _ranges(con, "train_step")[:1])
    assert (bd.first_step.count, bd.first_step.ns) == (first_records, first_ns)


def test_flax_loop_steady_steps_match_hand_count(db) -> None:
    con = db("flax_loop")
    bd = breakdown(load_profile(LOOPS / "flax_loop.sqlite.gz"))
    steps = _ranges(con, "train_step")
    _, ns = _inside(con, steps[1:])
    p = bd.phases["train_step"]
    assert p.steps == 5 and p.gpu_ns_per_step == pytest.approx(ns / 5)
    # compilation and autotuning live in the first step, and only there
    assert bd.first_step.count + bd.autotuning.count >= _inside(con, steps[:1])[0] > p.kernels_per_step * 10
    assert bd.autotuning.count > 0 and not any(k.category == Category.AUTOTUNING.value for k in p.kernels)


def test_no_nvtx_gives_whole_profile_and_api_summary(db) -> None:
    con = db("torch_nonvtx")
    bd = breakdown(load_profile(LOOPS / "torch_nonvtx.sqlite.gz"))
    (whole,) = bd.phases.values()
    records, ns = _inside(con, [(0, 2**62)])
    assert whole.gpu_ns_per_step == ns and whole.kernels_per_step + whole.copies_per_step == records
    assert any(k.gemm for k in whole.kernels)
    api = {a.name: a for a in bd.api}
    count, total = con.execute(
        "SELECT COUNT(*), SUM(r.end - r.start) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON "
        "r.nameId = s.id WHERE s.value = 'cudaStreamSynchronize_v3020'").fetchone()
    assert (api["cudaStreamSynchronize"].count, api["cudaStreamSynchronize"].total_ns) == (count, total)
    assert api["cudaStreamSynchronize"].group == "synchronization" and api["cudaLaunchKernel"].group == "launch"
    md = render.breakdown_markdown([bd])
    assert "CUDA API calls" in md and "whole profile" in md


def test_unsynchronized_program_is_attributed_by_launch() -> None:
    """The GPU running 2 ms behind the host (planted: kernels shifted later, launches kept):
    execution intervals put forward's kernels into backward; launch calls do not."""
    prof = load_profile(LOOPS / "torch_loop.sqlite.gz")
    ref = breakdown(prof, attribution="execution")
    kt = prof.kernels
    late = replace(prof, kernels=replace(kt, start=kt.start + 2_000_000, end=kt.end + 2_000_000))
    auto = breakdown(late)
    assert auto.attribution == "launch" and auto.moved_share > 0.03
    assert auto.outside_share > 0.03 and any("outside every range" in w for w in auto.warnings)
    for phase in ("forward", "backward", "optimizer"):
        assert auto.phases[phase].gpu_ns_per_step == pytest.approx(ref.phases[phase].gpu_ns_per_step)
    by_exec = breakdown(late, attribution="execution")
    assert by_exec.phases["forward"].gpu_ns_per_step != pytest.approx(ref.phases["forward"].gpu_ns_per_step)


def test_whole_graph_records_are_named_and_never_cut() -> None:
    bd = breakdown(load_profile(LOOPS / "flax_graphs.sqlite.gz"))
    assert any("--cuda-graph-trace=node" in n and "6 graph launches" in n for n in bd.notes)
    top = bd.phases["train_step"].kernels[0]
    assert top.category == Category.GRAPH.value and not bd.warnings
    assert render.short_name(top.name, 20) == top.name


def _planted(kernels: list[Kernel], ranges: list[Range]) -> Profile:
    return Profile("planted.sqlite", "planted", "nsys", kernels, ranges)


def test_names_only_in_the_first_steady_step_are_kept_out() -> None:
    steps = [Range("warmup", 0, 90), *(Range("step", s, s + 90) for s in (100, 200, 300))]
    kernels = [Kernel("gemm_a", s + 10, s + 40) for s in (100, 200, 300)] + [Kernel("candidate_gemm_b", 150, 170)]
    bd = breakdown(_planted(kernels, steps))
    assert bd.phases["step"].gpu_ns_per_step == 30 and bd.first_only.count == 1 and bd.first_only.ns == 20


def test_softmax_inside_attn_softmax_is_softmax_and_says_so() -> None:
    ranges = [Range("step", 0, 100), Range("forward", 0, 100), Range("attn_softmax", 10, 50)]
    kernels = [Kernel("input_reduce_fusion_3", 20, 40), Kernel("input_reduce_fusion_3", 60, 70)]
    fwd = breakdown(_planted(kernels, ranges)).phases["forward"]
    cats = {(k.category, k.inferred_from) for k in fwd.kernels}
    assert cats == {("softmax", "attn_softmax"), ("reduction", None)}


def test_short_names_stay_distinct() -> None:
    a = "void at::native::elementwise_kernel<128, 4, " + "x" * 100 + "_float_A>(int)"
    b = "void at::native::elementwise_kernel<128, 4, " + "x" * 100 + "_float_B>(int)"
    shorts = render.short_names([a, b, a], 60)
    assert shorts[0] != shorts[1] and shorts[0].endswith("A> #1") and shorts[2].endswith("#2")
    assert all(len(s) <= 64 for s in shorts)


def test_report_top_negative_is_one_line(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        report.main([str(LOOPS / "torch_loop.sqlite.gz"), "--top", "-3"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "error: argument --top: expected a positive integer, got '-3'" in err


def test_report_out_naming_a_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "kept.md").write_text("keep me")
    assert report.main([str(LOOPS / "torch_loop.sqlite.gz"), "--out", str(tmp_path / "kept.md")]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "folder" in err and err.count("\n") == 1
    assert (tmp_path / "kept.md").read_text() == "keep me"


def test_api_summary_counts_are_in_every_report(tmp_path: Path) -> None:
    assert report.main([str(LOOPS / "torch_loop.sqlite.gz"), "--out", str(tmp_path / "r")]) == 0
    md = (tmp_path / "r" / "kernels.md").read_text()
    assert "| launch |" in md and "| synchronization |" in md and "first of 6 `train_step`" in md
    assert np.isfinite(float(md.split("| launch | ")[1].split(" |")[0]))
