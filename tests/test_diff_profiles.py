"""harness.diff on any two profiles (nsys or torch.profiler or JAX, one rank or several),
and the mismatches it can detect (GPU, rank count) refused unless --force."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import diff
from harness.diffs.inputs import resolve_one

DATA = Path(__file__).parent / "data"
DDP = DATA / "user_profiles" / "ddp_loop.sqlite.gz"
KINETO = DATA / "user_profiles" / "torch_profiler"


def test_nsys_torchrun_against_torch_profiler_ranks(tmp_path: Path) -> None:
    a, b = resolve_one(DDP), resolve_one(KINETO)
    assert (a.ranks, b.ranks) == (2, 2) and a.gpu == b.gpu == "NVIDIA H100 80GB HBM3"
    # rank 0's phases, as the report's rank0 column gives them
    assert a.phases["forward"].kernels == 133 and b.phases["forward"].kernels == 133
    assert diff.main([str(DDP), str(KINETO), "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "diff.json").read_text())
    forward = next(p for p in doc["phases"] if p["phase"] == "forward")
    assert forward["parts"]
    assert any("2 ranks" in n for n in doc["notes"])
    # torch.profiler's ProfilerStep pairs with nsys's step0..step7: 451 kernels a step on both sides
    assert "step" in b.phases and a.phases["step"].kernels == b.phases["step"].kernels == 451
    assert any(p["phase"] == "step" for p in doc["phases"])


@pytest.mark.parametrize("a,b,needle", [
    (DDP, DATA / "user_profiles" / "jax" / "flax_loop.xplane.pb.gz", "different rank counts (2 vs 1)"),
    (DATA / "hta" / "ns_resolution_rank0.json.gz", KINETO / "rank0.json.gz",
     "different GPUs (Tesla V100-SXM2-32GB vs NVIDIA H100 80GB HBM3)"),
])
def test_unlike_profiles_are_refused_unless_forced(tmp_path: Path, capsys: pytest.CaptureFixture, a: Path, b: Path,
                                                   needle: str) -> None:
    assert diff.main([str(a), str(b), "--out", str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "--force" in err and len(err.splitlines()) == 1
    assert diff.main([str(a), str(b), "--out", str(tmp_path / "forced"), "--force"]) == 0
