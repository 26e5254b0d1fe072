"""Report rendering end to end on the captured profiles, and the CLI's failure path."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from harness import report
from harness.trace import render
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
