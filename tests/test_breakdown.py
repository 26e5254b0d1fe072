"""Attribution, per-step means and failures, on real profiles from `harness.run`.

Fixtures (tests/data/<scenario>/, captured by tests/data/capture_fixtures.py on an H200):
nsys SQLite exports of `harness.run`, their result JSON, and the framework-profiler
fallback's traces.  The CPU fallback is also exercised live, on this machine.
"""

from __future__ import annotations

import gzip
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from harness import backends
from harness.backends import profilers, ranges
from harness.trace.analyses.breakdown import answers, breakdown, load_profile
from harness.trace.kernels import Category
from harness.trace.profile import KERNEL, ProfileError
from harness.trace.sources.nsys import find_nsys, profile_command

DATA = Path(__file__).parent / "data"


def fixture(scenario: str, suffix: str = ".sqlite.gz") -> Path:
    path = DATA / scenario / f"{scenario}{suffix}"
    assert path.exists(), f"missing fixture {path}"
    return path


@pytest.fixture(scope="module")
def torch_attn():
    return load_profile(fixture("torch_tiny_attn"))


@pytest.fixture(scope="module")
def jax_small():
    return load_profile(fixture("jax_small_train"))


def test_torch_backward_kernels_come_from_another_thread_and_still_count(torch_attn) -> None:
    prof = torch_attn
    kt = prof.kernels
    backward = [r for r in prof.ranges if r.name == "backward"]
    in_bwd = np.zeros(len(kt), bool)
    for r in backward:
        in_bwd |= (kt.start >= r.start) & (kt.end <= r.end)
    pushers = {r.thread for r in backward}
    # the case nsys's own NVTX projection gets wrong: launched by autograd's thread
    foreign = in_bwd & ~np.isin(kt.thread, list(pushers))
    assert foreign.sum() > in_bwd.sum() / 2
    bd = breakdown(prof)
    bwd = bd.phases["backward"]
    warm = np.zeros(len(kt), bool)
    for w in (r for r in prof.ranges if r.name == "warmup"):
        warm |= (kt.start >= w.start) & (kt.end <= w.end)
    measured = in_bwd & ~warm
    assert (bwd.kernels_per_step + bwd.copies_per_step) * bwd.steps == pytest.approx(measured.sum())
    assert bwd.copies_per_step * bwd.steps == pytest.approx((measured & (kt.kind != KERNEL)).sum())
    assert bwd.gpu_ns_per_step > bd.phases["forward"].gpu_ns_per_step  # backward does ~2x the matmuls


def test_per_step_means_and_phase_sums(jax_small) -> None:
    bd = breakdown(jax_small)
    step = bd.phases["step"]
    assert step.steps == 3  # --steps 3; the fused loop's `step` ranges are not split steps
    assert bd.phases["fused_step"].steps == 3
    parts = sum(bd.phases[p].gpu_ns_per_step for p in ("forward", "backward", "optimizer"))
    assert 0 < parts <= step.gpu_ns_per_step * (1 + 1e-9)
    for p in bd.phases.values():
        assert sum(p.categories.values()) == pytest.approx(p.gpu_ns_per_step)
        assert p.gpu_ns_per_step <= p.range_ns_per_step * 1.01  # one stream: kernels fit in the range
    # warm-up kernels are counted apart, not in any phase
    assert bd.warmup.count > 0


def test_jax_autotuning_kernels_are_excluded(jax_small) -> None:
    kt = jax_small.kernels
    tuning = np.isin(kt.name, [i for i, n in enumerate(kt.names) if "RedzoneAllocatorKernel" in n or "DelayKernel" in n])
    assert tuning.any(), "XLA autotuned the small model's GEMMs in its first call"
    bd = breakdown(jax_small)
    assert bd.autotuning.count >= tuning.sum()
    assert all(k.category != Category.AUTOTUNING.value for p in bd.phases.values() for k in p.kernels)
    # XLA autotunes while compiling, i.e. during the first (warm-up) call of each function
    in_warmup = np.zeros(len(kt), bool)
    for w in (r for r in jax_small.ranges if r.name == "warmup"):
        in_warmup |= (kt.start >= w.start) & (kt.end <= w.end)
    assert in_warmup[tuning].all()


def test_jax_optimizer_fusions_are_optimizer(jax_small) -> None:
    opt = breakdown(jax_small).phases["optimizer"]
    assert opt.share(Category.OPTIMIZER) > 0.9


def test_answers_from_a_training_step(jax_small) -> None:
    ans = answers(breakdown(jax_small))
    assert ans["a"]["kernel_ms"] <= ans["a"]["range_ms"]
    assert ans["b"]["calls_per_forward"] >= 1
    assert ans["d"]["gemm_forward_share"] > 0.3
    assert ans["e"] is None  # no attention ranges inside jit


def test_attention_ranges_answer_e(torch_attn) -> None:
    bd = breakdown(torch_attn)
    meta = {"batch": 4, "seq": 64, "heads": 2, "d_head": 64}
    e = answers(bd, metadata=meta)["e"]
    assert set(e["ms_per_step"]) == {"attn_scores", "attn_softmax", "attn_values"}
    assert e["softmax_to_matmuls_flops"] == pytest.approx(5 / (4 * 64))
    assert bd.phases["attn_scores"].occurrences == 2 * 3  # 2 layers x 3 steps
    assert bd.phases["attn_softmax"].share(Category.SOFTMAX) > 0.2
    assert bd.phases["attn_softmax"].kernels[0].category != Category.OTHER.value


# -- failures: one clear line each ---------------------------------------------------
def test_not_sqlite(tmp_path: Path) -> None:
    bad = tmp_path / "x.sqlite"
    bad.write_text("hello")
    with pytest.raises(ProfileError, match="not an SQLite file"):
        load_profile(bad)
    other = tmp_path / "x.txt"
    other.write_text("")
    with pytest.raises(ProfileError, match="not a profile"):
        load_profile(other)
    with pytest.raises(ProfileError, match="not a gzip file"):
        load_profile(bad.rename(tmp_path / "x.sqlite.gz"))


def test_export_without_kernel_table(tmp_path: Path) -> None:
    db_path = tmp_path / "nokernels.sqlite"
    db_path.write_bytes(gzip.decompress(fixture("torch_tiny_attn").read_bytes()))
    with sqlite3.connect(db_path) as db:
        db.execute("DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL")
    with pytest.raises(ProfileError, match="no CUDA kernel records"):
        load_profile(db_path)


def test_jax_tsl_domain_error_refuses_only_when_kernels_are_missing(tmp_path: Path) -> None:
    """nsys without --nvtx-domain-exclude=TSL on a JAX run: the importer reports an error;
    here every kernel launch still has its kernel record, so the analysis goes on with a note.
    With records deleted (as the importer does when it drops them) it refuses, unless forced."""
    prof = load_profile(fixture("jax_tsl_included"))
    assert "nvtx-domain-exclude=TSL" in prof.notes[0] and "all 1362 kernel launches" in prof.notes[0]
    assert breakdown(prof).phases["forward"].kernels_per_step > 0
    db_path = tmp_path / "lost.sqlite"
    db_path.write_bytes(gzip.decompress(fixture("jax_tsl_included").read_bytes()))
    with sqlite3.connect(db_path) as db:
        db.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid % 2 = 0")
    with pytest.raises(ProfileError, match="nvtx-domain-exclude=TSL") as err:
        load_profile(db_path)
    assert "\n" not in str(err.value) and "--force" in str(err.value)
    assert "--force" in load_profile(db_path, force=True).notes[0]


def test_no_ranges_and_missing_range(torch_attn) -> None:
    from dataclasses import replace

    whole = breakdown(replace(torch_attn, ranges=[]))
    assert list(whole.phases) == ["(whole profile)"] and whole.attribution == "none"
    with pytest.raises(ProfileError, match="no range named 'fused_step'"):
        breakdown(torch_attn, require=["fused_step"])


def test_nsys_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "nsys"
    fake.write_text("")
    monkeypatch.setenv("NSYS", str(fake))
    cmd = profile_command(tmp_path / "out", ["python", "-m", "harness.run"], flags=backends.get("jax").nsys_flags)
    assert cmd[:2] == [str(fake), "profile"]
    assert "--trace=cuda,nvtx" in cmd and "--nvtx-domain-exclude=TSL" in cmd
    assert cmd[-3:] == ["python", "-m", "harness.run"]
    assert "--nvtx-domain-exclude=TSL" not in profile_command(tmp_path / "o", ["x"], flags=backends.get("torch").nsys_flags)
    monkeypatch.delenv("NSYS")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ProfileError, match="NSYS=/path/to/nsys"):
        find_nsys()


# -- framework-profiler fallback -----------------------------------------------------
@pytest.mark.parametrize("scenario,suffix", [("torch_fallback", ".json.gz"), ("jax_fallback", ".xplane.pb.gz")])
def test_gpu_fallback_traces(scenario: str, suffix: str) -> None:
    backend = scenario.split("_")[0]
    prof = load_profile(DATA / scenario / f"{backend}_tiny_fallback{suffix}")
    assert not prof.notes  # GPU kernels, not CPU stand-ins
    bd = breakdown(prof)
    assert {"step", "forward", "backward", "optimizer"} <= set(bd.phases)
    assert bd.phases["step"].share(Category.GEMM) > 0.05


def _cpu_session_run(backend: str, tmp_path: Path):
    from harness.config import get_config

    cfg = get_config("tiny")
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 17))
    if backend == "torch":
        from harness.backends.torch.session import TorchSession as Session
    else:
        from harness.backends.jax.session import JaxSession as Session
    s = Session(cfg, tokens, device="cpu", dtype="fp32", seed=0)
    ranges.use_framework_annotations(backends.get(backend).annotation())
    try:
        for name in ("warmup", "step", "step"):
            with ranges.phase_range(name):
                for phase, fn in (("forward", s.forward), ("backward", s.backward), ("optimizer", s.optimizer_step)):
                    with ranges.phase_range(phase):
                        out = fn()
                        s.sync(out) if backend == "jax" else s.sync()
    finally:
        ranges.use_framework_annotations(None)


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_cpu_fallback(backend: str, tmp_path: Path) -> None:
    if backend == "torch":
        out = tmp_path / "trace.json"
        with profilers.torch_profiler(out):
            _cpu_session_run(backend, tmp_path)
    else:
        out = tmp_path / "trace"
        with profilers.jax_profiler(out):
            _cpu_session_run(backend, tmp_path)
    bd = breakdown(load_profile(out))
    assert "CPU" in bd.notes[0]
    assert bd.phases["step"].steps == 2
    assert bd.warmup.count > 0
    assert bd.phases["forward"].kernels_per_step > 0


@pytest.mark.parametrize("scenario", ["torch_small_train", "jax_small_train"])
def test_the_wait_for_each_phase_s_first_kernel_is_read_from_the_export(scenario: str, tmp_path: Path) -> None:
    """Each phase's idle lead-in per step against the SQLite export read here: per measured step,
    from the phase's first range in it to the first kernel, copy or memset starting inside one of
    those ranges, averaged over the steps; and the answer names it where it is over 1% of the step."""
    db_path = tmp_path / "p.sqlite"
    db_path.write_bytes(gzip.decompress(fixture(scenario).read_bytes()))
    db = sqlite3.connect(db_path)
    named = db.execute("select e.start, e.end, coalesce(e.text, s.value) from NVTX_EVENTS e left join StringIds s "
                       "on e.textId = s.id where e.end is not null").fetchall()
    starts = sorted(r[0] for t in ("KERNEL", "MEMCPY", "MEMSET") for r in db.execute(
        f"select start from CUPTI_ACTIVITY_KIND_{t}"))
    bd = breakdown(load_profile(db_path))
    warm = [(a, b) for a, b, n in named if n == "warmup"]
    for phase, p in bd.phases.items():
        roots = sorted((a, b) for a, b, n in named if n == p.root and not any(w <= a and b <= x for w, x in warm))
        assert len(roots) == p.steps, phase  # the steps measured: those outside the warm-up ranges
        leads = []
        for s0, s1 in roots:
            inner = [(a, b) for a, b, n in named if n == phase and s0 <= a and b <= s1]
            first = min(t for t in starts if any(a <= t < b for a, b in inner))
            leads.append(first - min(a for a, _ in inner))
        assert p.lead_ns_per_step == pytest.approx(sum(leads) / len(leads), rel=1e-12), phase
    from harness.trace.analyses.findings import report_findings

    step = bd.phases["step"]
    (bound,) = [f.text for f in report_findings([bd]) if f.topic == "bound"]
    said = f"it waits {step.lead_ns_per_step / 1e6:.1f} ms of it for the host to launch the step's first kernel"
    assert (said in bound) == (step.lead_ns_per_step > 0.01 * step.range_ns_per_step)
