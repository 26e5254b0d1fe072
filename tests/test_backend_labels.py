"""A backend registered at run time under a name that holds two built-in ones
(`torch-compile-x`: `torch-compile`, `torch`) and no framework of the built-ins gets its own
label wherever the harness labels a backend: a profile file, a sweep's ratio table and its
answer, a comparison's table, a run's data-parallel line, parity; and what the harness
knows of it comes from its record, never from its name (the FSDP2 all-gathers, the library
whose version its documents record)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from harness import backends

NAME = "torch-compile-x"
EXACT = {"logits": 1e-6, "loss": 1e-6, "grad": 1e-6, "param": 1e-6, "update": 1e-6}


@pytest.fixture
def toy(monkeypatch):
    """Eager torch's record under another name, of a framework of its own, with data-parallel
    labels of its own, taking the DDP/FSDP2 options (`wrap_options`) but gathering no
    parameters of known size, its documents recording the version of a library of its own."""
    monkeypatch.delenv(backends.PLUGINS_ENV, raising=False)
    record = dataclasses.replace(backends.get("torch"), name=NAME, framework="", reference=False, default=False,
                                 tolerances={"fp32": EXACT}, parallel={"ddp": "toy DDP", "fsdp": "toy FSDP"},
                                 gathers_parameters=False, libraries=("toylib",))
    assert record.wrap_options and not record.fused_step
    backends.register(record)
    yield record
    backends.unregister(NAME)


def _phase(ms: float) -> dict:
    return {"median_ms": ms, "p10_ms": ms, "p90_ms": ms, "tflops": None, "mfu": None, "peak_memory_bytes": None}


def test_profile_files_are_labelled_by_the_longest_registered_name(toy) -> None:
    from harness.trace.profile import label_from_path

    assert label_from_path("runs/torch-compile-x-trace.json") == NAME
    assert label_from_path("torch-compile-x.rank0.sqlite.gz") == NAME
    assert label_from_path("torch-compile.nsys-rep") == "torch-compile"


def test_sweep_ratio_table_and_answer_name_it(toy) -> None:
    """The toy's cells over torch's, in a table and a finding of their own beside JAX's."""
    from harness.reports.sweep import section_times
    from harness.reports.sweep_answer import sweep_findings
    from harness.sweeps.analysis import ratio_rows

    ms = {"torch": (2.0, 4.0, 8.0, None), "jax": (1.0, 3.0, 5.0, 4.0), NAME: (3.0, 6.0, 12.0, None)}
    rows = [{"model": "tiny", "ctx": 16, "batch": 2, "data_parallel": 1, "dtype": "fp32", "backend": b,
             "status": "ok", "reason": None, "forward": _phase(f), "backward": _phase(bw), "optimizer": None,
             "step": _phase(s), "fused_step": _phase(fs) if fs else None} for b, (f, bw, s, fs) in ms.items()]
    ratios = ratio_rows(rows)
    assert [(r["backend"], r["reference"]) for r in ratios] == [("jax", "torch"), (NAME, "torch")]
    toy_row = ratios[1]
    assert toy_row["forward"] == pytest.approx(3.0 / 2.0) and toy_row["step"] == pytest.approx(12.0 / 8.0)
    assert toy_row["fused_step"] is None and ratios[0]["fused_step"] == pytest.approx(4.0 / 8.0)
    data = {"phases": rows, "ratios": ratios, "batches": [2], "data_parallel": [1], "best": [], "speedups": [],
            "bound_notes": [], "failed": []}
    text = "\n".join(section_times(data))
    assert "### JAX / torch (median ratio; fused_step: JAX fused step over torch step; < 1: JAX faster)" in text
    assert f"### {NAME} / torch (median ratio; < 1: {NAME} faster)" in text
    toy_table = text.split(f"### {NAME} / torch")[1]
    assert "| tiny | 16 | fp32 | 1.50x | 1.50x | 1.50x |" in toy_table
    speed = [f.text for f in sweep_findings(data) if f.topic == "speed"]
    assert speed == ["fp32: jax's step takes 0.50x (median; 0.50-0.50x over 1 cell) the time of torch's; "
                     "jax is faster in 1 of 1",
                     f"fp32: {NAME}'s step takes 1.50x (median; 1.50-1.50x over 1 cell) the time of torch's; "
                     f"{NAME} is faster in 0 of 1"]


def test_compare_table_and_run_lines_name_it(toy) -> None:
    from harness.reports.compare import table_rows
    from harness.reports.run import format_data_parallel
    from harness.runs.compare import phase_table

    runs = {b: {"status": "ok", "phases": {"forward": _phase(f), "step": _phase(s),
                                           **({"fused_step": _phase(fs)} if fs else {})}}
            for b, (f, s, fs) in {"torch": (2.0, 8.0, None), "jax": (1.0, 5.0, 4.0), NAME: (3.0, 12.0, None)}.items()}
    rows = table_rows({"runs": runs, "table": phase_table(runs)})
    assert rows[0][:4] == ["phase", "torch ms (median, p10-p90)", "jax ms (median, p10-p90)",
                           f"{NAME} ms (median, p10-p90)"]
    fused = next(r for r in rows if r[0].startswith("fused_step"))
    assert fused[0] == f"fused_step (torch, {NAME}: step)"  # the toy's step stands in the row, as torch's
    assert fused[3] == "12.000 (12.000-12.000)" and fused[5] == "1.50x"
    dp = {"n": 2, "parallel": "fsdp", "global_batch": 4, "step_ms": 1.0, "tokens_per_s": 64.0, "ranks": [0],
          "note": "one rank timed"}
    assert format_data_parallel({"options": {"backend": NAME}, "data_parallel": dp})[0].startswith(
        "data-parallel 2 (toy FSDP), global batch 4")


def test_communication_sizes_come_from_the_record(toy, tmp_path, monkeypatch) -> None:
    """The toy takes the wrap options but gathers no parameters of known size: its FSDP run
    has a reduce-scatter size only, where torch's FSDP2 has its all-gathers too."""
    from harness.runs.compare_profiles import communication_overlap
    from harness.trace.analyses import overlap

    sizes = {}
    monkeypatch.setattr(overlap, "rank_profiles", lambda files, nsys_bin, size: sizes.setdefault(len(sizes), size))
    doc = {"num_params": 1000, "options": {"parallel": "fsdp"}}
    profiles = {}
    for b in ("torch", NAME):
        (tmp_path / f"{b}.sqlite").write_text("")
        profiles[b] = str(tmp_path / f"{b}.sqlite")
    communication_overlap(profiles, 1, None, {"torch": doc, NAME: doc})
    assert sizes == {0: {"reduce-scatter": 4000.0, "all-gather": 8000.0}, 1: {"reduce-scatter": 4000.0}}


class _Session:
    """Fixed numbers for every backend: parity finds each equal to the reference."""

    def __init__(self) -> None:
        self.w = {"w": np.ones(3)}

    def logits(self):
        return np.arange(4.0)

    def loss_and_grads(self):
        return 1.0, {"w": np.full(3, 0.5)}

    def zero_grad(self) -> None:
        pass

    def params(self):
        return dict(self.w)

    def forward(self) -> None:
        pass

    backward = forward

    def optimizer_step(self) -> None:
        self.w = {"w": self.w["w"] - 0.1}

    def device_name(self) -> str:
        return "cpu"

    def versions(self) -> dict:
        return {}


def test_parity_compares_it_by_default_and_labels_its_rows(toy, monkeypatch) -> None:
    """A backend of a framework of its own is compared by default, like JAX, under its name."""
    from harness.config import get_config
    from harness.timing import parity, runner

    asked = []
    monkeypatch.setattr(runner, "make_session", lambda spec, config: asked.append(spec.backend) or _Session())
    result = parity.check_parity(get_config("tiny"), steps=1)
    assert asked == ["torch", "jax", NAME] and result.ok
    assert list(result.attention) == ["torch", "jax", NAME] and {r.backend for r in result.rows} == {"jax", NAME}
    assert result.to_json()["tolerances"][NAME] == EXACT
    assert any(line.startswith(f"{NAME:<16} logits") for line in parity.format_table(result).splitlines())


def test_version_lines_name_its_library(toy, tmp_path) -> None:
    from harness.reports.provenance_block import provenance
    from harness.reports.sweep import section_environment

    env = {"device": "cpu", "torch": "2.0", "toylib": "1.2"}
    assert section_environment({"cells": [{"result": {"env": env}}]})[2:5] == ["- device: cpu", "- torch: 2.0",
                                                                             "- toylib: 1.2"]
    (tmp_path / "run.json").write_text(json.dumps({"env": env}))
    assert "device cpu; torch 2.0; toylib 1.2; tree" in provenance(tmp_path, "")
