"""harness.compare and harness.run end to end on the CPU beside tests/test_compare.py's shared
comparison: a compare profiled with the framework profilers, out-of-memory in one backend
and in JAX's split step, and runs in forward mode and with the Pallas kernel. A file of its
own, so that the two test workers (each takes a file whole) share these runs between them."""

import gzip
import json
import os
import sys

import pytest

from harness.timing.runner import run
from harness.timing.spec import RunSpec
from tests.test_compare import cli


def test_run_in_forward_mode_has_only_forward_and_step():
    doc = run(RunSpec(backend="jax", model="tiny", ctx=16, batch=1, warmup=1, steps=2, mode="forward"))
    assert doc["status"] == "ok" and set(doc["phases"]) == {"forward", "step"}
    assert doc["phases"]["step"]["flops"] == doc["phases"]["forward"]["flops"]


def test_jax_run_with_the_pallas_kernel_matches_naive_attention():
    """--attention pallas reaches the JAX model (interpret mode on CPU) and starts
    from the same weights as naive attention: same first loss."""
    common = dict(backend="jax", model="tiny", ctx=16, batch=1, warmup=0, steps=1, mode="forward")
    pallas = run(RunSpec(**common, attention="pallas"))
    naive = run(RunSpec(**common, attention="naive"))
    assert pallas["status"] == "ok", pallas["error"]
    assert pallas["options"]["attention"] == "pallas"
    assert pallas["loss"]["first"] == pytest.approx(naive["loss"]["first"], rel=1e-5)


def test_simulated_oom_is_reported_and_the_other_backend_still_runs(tmp_path):
    proc = cli("harness.compare", "--model", "tiny", "--ctx", "16", "--batch", "1", "--warmup", "1", "--steps", "2",
               "--device", "cpu", "--backend", "torch,jax", "--out", str(tmp_path), "--no-parity",
               "--fail-in", "jax:optimizer")
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "jax: FAILED: out of memory in optimizer (model tiny, batch 1, ctx 16, fp32)" in proc.stdout
    summary = json.loads((tmp_path / "tiny-ctx16-fp32-cpu" / "summary.json").read_text())
    assert summary["ok"] is False
    assert summary["runs"]["jax"]["status"] == "oom" and "phases" not in summary["runs"]["jax"]
    assert summary["runs"]["torch"]["status"] == "ok"
    assert all(row["jax"] is None for row in summary["table"])  # no timing from the failed run
    report = (tmp_path / "tiny-ctx16-fp32-cpu" / "report.md").read_text()
    assert "out of memory in optimizer" in report


def test_jax_split_step_out_of_memory_still_times_the_fused_step(tmp_path, monkeypatch, capsys):
    """JAX's split step keeps the forward's residuals between two programs and can run out
    of memory where the fused step fits: the run records the failure and times the fused
    step alone; an out-of-memory in the fused step itself fails the run. harness.run's
    entry point runs in this process: what is checked is its result and its output."""
    from harness import run as run_cli

    monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # harness.run sets it for --device cpu; put back after
    out = tmp_path / "jax.json"
    code = run_cli.main(["--backend", "jax", "--model", "tiny", "--ctx", "16", "--batch", "1", "--warmup", "1",
                         "--steps", "3", "--device", "cpu", "--fail-in", "backward", "--out", str(out)])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["status"] == "ok" and list(doc["phases"]) == ["fused_step"]
    assert len(doc["phases"]["fused_step"]["times_ms"]) == 3
    assert doc["split_step_failure"] == {"status": "oom", "phase": "backward",
                                         "message": "out of memory in backward (model tiny, batch 1, ctx 16, fp32)"}
    assert [x["loop"] for x in doc["loss"]["measured"]] == ["fused step"] * 3
    first = doc["first_step"]
    assert first["time_to_first_step_ms"] == pytest.approx(first["setup_ms"] + first["fused_step_ms"])
    assert "split step: out of memory in backward" in stdout
    code = run_cli.main(["--backend", "jax", "--model", "tiny", "--ctx", "16", "--batch", "1", "--warmup", "1",
                         "--steps", "1", "--device", "cpu", "--fail-in", "fused_step", "--out", str(out), "--overwrite"])
    assert code != 0 and json.loads(out.read_text())["status"] == "oom"


def test_profile_fallback_with_attention_ranges_feeds_the_kernel_report(tmp_path, monkeypatch):
    """Without nsys, --profile records each backend with its framework profiler; the
    attention ranges of --annotate-attention reach answer (e) for both backends."""
    monkeypatch.setenv("NSYS", str(tmp_path / "no-nsys-here"))
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable))
    proc = cli("harness.compare", "--model", "tiny", "--ctx", "32", "--batch", "1", "--warmup", "1", "--steps", "2",
               "--device", "cpu", "--out", str(tmp_path), "--no-parity", "--profile", "--annotate-attention",
               "--timeline")
    assert proc.returncode == 0, proc.stderr[-2000:]
    folder = tmp_path / "tiny-ctx32-fp32-cpu-profiled"
    assert {"kernels.md", "kernels.csv", "kernels.json", "kernels.png", "report.md", "report.html",
            "timeline.json.gz"} <= set(os.listdir(folder))
    with gzip.open(folder / "timeline.json.gz", "rt") as f:
        events = json.load(f)["traceEvents"]
    processes = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert processes == {"torch", "jax", "jax fused_step"}
    steps = [e["ts"] for e in events if e.get("cat") == "user_annotation" and e["name"] in ("step", "fused_step")]
    assert len(steps) == 3 * 2 and len(set(steps)) == 2 and min(steps) == 0  # 2 measured steps each, aligned
    doc = json.loads((folder / "kernels.json").read_text())
    assert [bd["label"] for bd in doc] == ["torch", "jax"]
    for bd in doc:
        assert bd["source"] in ("torch.profiler", "jax.profiler")
        e = bd["answers"]["e"]
        assert e["flops_per_call"]["attn_scores"] == 2 * 1 * 2 * 32 * 32 * 64  # 2*B*H*T^2*Dh
        assert all(ms > 0 for ms in e["ms_per_step"].values())
    assert "## Kernel breakdown" in (folder / "report.md").read_text()
    kernels_md = (folder / "kernels.md").read_text().splitlines()
    assert kernels_md[2] == "## The answer" and kernels_md[4].startswith("- torch: ")  # the answer first, as report's
