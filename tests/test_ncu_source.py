"""harness.ncu_source on a real Nsight Compute source export: the fused Hopper
backward (head_dim 128, seq 16384, causal, one H100), one launch sampled."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from harness import ncu_source as ncu_source_cli
from harness.attention import ncu_stalls as ncu_source

DATA = Path(__file__).parent / "data" / "ncu"
FIXTURE = DATA / "mosaic_bwd_fused_d128_causal_sass.csv.gz"
KERNEL = "flash_attention_mgpu_bwd_fused_mosaic_gpu_kernel"


def test_instructions_samples_and_reasons_are_read() -> None:
    (kernel,) = ncu_source.read_source(FIXTURE)
    assert kernel.name == KERNEL and len(kernel.instructions) == 1936
    assert kernel.samples == 556660
    branch = kernel.instructions[356]  # the producer's wait for a free slot: try_wait, then this branch
    assert branch.sass.startswith("@!P1  BRA") and branch.executed == 1040384 and branch.samples == 125503
    assert branch.stalls["long_sb"] == 125353
    # The reasons add up to each instruction's samples; "other" holds what no column names.
    assert all(sum(i.stalls.values()) == i.samples for i in kernel.instructions)
    assert kernel.instructions[1545].stalls["other"] == 5938


def test_stall_totals_over_the_kernel() -> None:
    (kernel,) = ncu_source.read_source(FIXTURE)
    totals = ncu_source.stall_totals(kernel.instructions)
    assert list(totals)[:3] == ["long_sb", "short_sb", "wait"]
    assert totals["long_sb"] == 218701 and totals["short_sb"] == 78582 and totals["selected"] == 56039
    assert sum(totals.values()) == kernel.samples


def test_loops_separate_the_producer_from_the_consumers() -> None:
    """The producer's loop (4 warps per CTA) runs half as often as the
    consumers' (8 warps) and holds a third of the samples, nearly all of them
    waits on its barriers; the consumers' first loop waits on shared memory."""
    (kernel,) = ncu_source.read_source(FIXTURE)
    found = {(lp.first, lp.last): lp for lp in ncu_source.loops(kernel)}
    producer = found[(343, 447)]
    assert producer.executed == 1040384 and producer.samples == 180356
    assert max(producer.stalls, key=producer.stalls.get) == "long_sb"
    consumer = found[(859, 1034)]
    assert consumer.executed == 2 * 1040384 + 32768 and consumer.samples == 133719
    assert max(consumer.stalls, key=consumer.stalls.get) == "short_sb"
    assert all(lp.samples >= 0.01 * kernel.samples for lp in found.values())
    assert len(ncu_source.loops(kernel, min_share=0.0)) > len(found)


def test_hottest_and_markdown() -> None:
    (kernel,) = ncu_source.read_source(FIXTURE)
    assert [i.index for i in ncu_source.hottest(kernel, 3)] == [356, 407, 970]
    md = ncu_source.source_markdown(kernel, FIXTURE.name, top=5)
    assert f"# Warp-state samples of `{KERNEL}`" in md
    assert "| long_sb | 218701 | 39.3% |" in md
    assert "| 343-447 | 1040384 | 180356 | 32.4% | long_sb 92.7%" in md
    assert "| 970 | `WARPGROUP.DEPBAR.LE gsb0, 0x1` | 2113536 | 20040 | 3.6% | barrier 98.8%" in md
    assert md.count("| `") == 5


def test_uncompressed_export_reads_the_same(tmp_path) -> None:
    plain = tmp_path / "sass.csv"
    plain.write_bytes(gzip.decompress(FIXTURE.read_bytes()))
    assert ncu_source.read_source(plain) == ncu_source.read_source(FIXTURE)


def test_a_details_export_is_refused_with_the_export_command(capsys) -> None:
    details = DATA / "flash_attention_fwd_d64.csv"
    with pytest.raises(ncu_source.NcuSourceError, match="--page source --print-source sass"):
        ncu_source.read_source(details)
    assert ncu_source_cli.main([str(details)]) == 2
    assert "error:" in capsys.readouterr().err
    assert ncu_source_cli.main([str(DATA / "no-such-file.csv")]) == 2
    with pytest.raises(SystemExit):
        ncu_source_cli.main([str(FIXTURE), "--top", "0"])
