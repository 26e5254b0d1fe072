"""Layer attribution on real nsys captures of `harness.run --layer-ranges` (torch eager,
tiny, bf16; tests/data/layers/capture_torch.sh): the per-layer sums are the phase kernel
totals, the planted wide block tops forward and backward, and the diff of the planted run
against the plain one names that layer first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.diffs.decompose import diff_runs
from harness.diffs.inputs import resolve_one
from harness.diffs.layers import largest_moves
from harness.trace.analyses.breakdown import breakdown, load_profile
from harness.trace.analyses.layers import OUTSIDE

DATA = Path(__file__).parent / "data" / "layers"
PLAIN, PLANTED = (DATA / f"torch_tiny_layers_{name}.harness.json" for name in ("plain", "planted"))
WIDE = "layers.1.ffn"

pytestmark = pytest.mark.skipif(not all(p.exists() and p.with_name(p.name.replace(".harness.json", ".sqlite.gz"))
                                        .exists() for p in (PLAIN, PLANTED)), reason="fixture not captured yet")


def _breakdown(run: Path):
    return breakdown(load_profile(run.with_name(run.name.replace(".harness.json", ".sqlite.gz"))))


@pytest.mark.parametrize("run", [PLAIN, PLANTED], ids=["plain", "planted"])
def test_layer_sums_equal_the_phase_kernel_totals(run: Path) -> None:
    bd = _breakdown(run)
    assert set(bd.layers) == {"forward", "backward"}
    for phase, layers in bd.layers.items():
        assert sum(layers.values()) == pytest.approx(bd.phases[phase].gpu_ns_per_step, rel=1e-9)
        # Most kernels sit in a canonical layer: the residual adds and the like stay a minority.
        assert layers.get(OUTSIDE, 0.0) < 0.5 * sum(layers.values()), phase
    doc = json.loads(run.read_text())
    assert doc["layer_ranges"]["overhead_ratio"] > 0


def test_planted_wide_block_s_ffn_stands_out() -> None:
    """At the tiny model's size naive attention's many small kernels outweigh any FFN, so
    the wide FFN is not the top layer; it is the FFN that takes far more than the others."""
    bd = _breakdown(PLANTED)
    for phase, layers in bd.layers.items():
        ffns = {k: v for k, v in layers.items() if k.endswith(".ffn")}
        assert all(ffns[WIDE] > 1.5 * v for k, v in ffns.items() if k != WIDE), (phase, ffns)


def test_diff_of_planted_against_plain_names_the_wide_layer_first() -> None:
    d = diff_runs(resolve_one(PLAIN), resolve_one(PLANTED))
    phase, row = largest_moves(d.layers)[0]
    assert row.name == WIDE and row.delta_ms > 0
