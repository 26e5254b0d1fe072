"""The GPU clock sampler (harness.timing.clocks): samples kept by the timer's intervals, the
figures per phase, the sampler's thread against a stand-in NVML, and why there is no sampler."""

from __future__ import annotations

import json
import statistics
import sys
import time
import types
from pathlib import Path

import pytest

from harness.common.hardware import boost_mhz, peak_tflops
from harness.timing.clocks import (
    INSTANT,
    MEAN,
    POWER_CAP,
    ClockSampler,
    Sample,
    open_sampler,
    peak_at_clock,
    summarize,
    watts_text,
)


def test_only_samples_inside_the_measured_calls_count() -> None:
    thermal = 0x20  # SwThermalSlowdown
    samples = [Sample(0.5, 0, 1980, 120.0, 0),  # warm-up: left out
               Sample(1.1, 0, 1700, 690.0, POWER_CAP), Sample(1.5, 0, 1750, 700.0, 0),
               Sample(3.2, 0, 1600, 700.0, POWER_CAP | thermal),
               Sample(5.0, 0, 1000, 300.0, 0)]  # after the last call: left out
    got = summarize(samples, {"fused_step": [(1.0, 2.0), (3.0, 4.0)], "optimizer": [(2.1, 2.2)]})
    step = got["phases"]["fused_step"]
    assert step["samples"] == 3
    assert step["sm_mhz"] == {"median": 1700, "min": 1600, "max": 1750}
    assert step["power_w"] == {"median": 700.0, "max": 700.0, "reading": MEAN}  # the reading the sampler names
    assert step["power_capped"] == pytest.approx(2 / 3)
    assert step["thermal"] == pytest.approx(1 / 3)
    assert step["call_mhz"] == [1725.0, 1600.0]
    # A call shorter than the sampling period holds no sample: no figures, not zeros.
    assert got["phases"]["optimizer"] == {"samples": 0, "call_mhz": [None]}
    assert got["devices"] == 1


def test_the_peak_scales_with_the_clock_from_the_datasheet_s() -> None:
    # H100 SXM and H200: 989.4 TFLOP/s = 132 SMs x 4096 FLOP per cycle x 1830 MHz.
    assert boost_mhz("NVIDIA H200") * 1e6 * 132 * 4096 / 1e12 == pytest.approx(peak_tflops("NVIDIA H200", "bf16"),
                                                                               rel=1e-3)
    assert peak_at_clock(989.4, 1830, 1700) == pytest.approx(989.4 * 1700 / 1830)
    assert peak_at_clock(989.4, None, 1700) is None
    assert peak_at_clock(None, 1830, 1700) is None


class _FakeNVML(types.SimpleNamespace):
    """What the sampler calls of pynvml, for two devices: the second cannot read its power."""

    NVML_CLOCK_SM = 1

    class NVMLError(Exception):
        pass

    def __init__(self):
        super().__init__(clock=iter(range(1000, 100000)), shut=False)

    def nvmlDeviceGetClockInfo(self, handle, which):
        assert which == self.NVML_CLOCK_SM
        return next(self.clock)

    def nvmlDeviceGetPowerUsage(self, handle):
        if handle == "gpu1":
            raise self.NVMLError("not supported")
        return 650_000  # mW

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return POWER_CAP

    def nvmlShutdown(self):
        self.shut = True


def test_each_read_samples_every_device_and_names_what_it_cannot_read() -> None:
    nvml = _FakeNVML()
    sampler = ClockSampler(nvml, ["gpu0", "gpu1"])
    before = time.perf_counter()
    sampler.read()
    first, second = sampler.samples
    assert (first.device, first.sm_mhz, first.power_w, first.reasons) == (0, 1000, 650.0, POWER_CAP)
    assert (second.device, second.sm_mhz, second.power_w) == (1, 1001, None)
    assert before <= first.t == second.t <= time.perf_counter()


class _Field(types.SimpleNamespace):
    """One of nvmlDeviceGetFieldValues's answers: its return code and its value's union."""


def _with_instant_power(nvml: _FakeNVML, answers: dict) -> _FakeNVML:
    """`nvml` whose devices answer the instantaneous power field: `answers` maps a handle to its
    mW, or to None for a device whose driver does not have the field."""
    def field_values(handle, ids):
        assert ids == [186]  # NVML_FI_DEV_POWER_INSTANT
        mw = answers[handle]
        return [_Field(nvmlReturn=0 if mw is not None else 3, value=types.SimpleNamespace(uiVal=mw or 0))]
    nvml.nvmlDeviceGetFieldValues = field_values
    return nvml


def test_power_is_the_instantaneous_reading_where_every_device_gives_it() -> None:
    """NVML's power usage is the last second's mean on current GPUs: a 60 ms step's samples then
    read under the cap the clock is held at. The sampler reads the instantaneous field where
    each device has it, else the mean on every device, and says which."""
    sampler = ClockSampler(_with_instant_power(_FakeNVML(), {"gpu0": 702_500, "gpu1": 698_000}), ["gpu0", "gpu1"])
    assert sampler.power_reading == INSTANT
    sampler.read()
    assert [s.power_w for s in sampler.samples] == [702.5, 698.0]
    # one device without the field: the mean for both, so one record holds one kind of reading
    sampler = ClockSampler(_with_instant_power(_FakeNVML(), {"gpu0": 702_500, "gpu1": None}), ["gpu0", "gpu1"])
    assert sampler.power_reading == MEAN
    sampler.read()
    assert [s.power_w for s in sampler.samples] == [650.0, None]  # nvmlDeviceGetPowerUsage's, as before
    assert ClockSampler(_FakeNVML(), ["gpu0"]).power_reading == MEAN  # bindings without field values


def test_the_power_says_which_reading_it_is() -> None:
    got = summarize([Sample(1.5, 0, 1700, 700.0, POWER_CAP)], {"step": [(1.0, 2.0)]}, INSTANT)
    assert got["phases"]["step"]["power_w"] == {"median": 700.0, "max": 700.0, "reading": INSTANT}
    assert watts_text(got["phases"]["step"]["power_w"]) == "700 W"
    # a record made before the instantaneous reading holds NVML's mean
    assert watts_text({"median": 448.2, "max": 470.0}) == "448 W (1 s mean)"


def test_a_run_records_the_reading_its_sampler_took() -> None:
    """The runner's clock record carries the sampler's kind of power reading, so an
    instantaneous one is not rendered as the mean."""
    from harness.timing.runner import _clock_record

    sampler = ClockSampler(_with_instant_power(_FakeNVML(), {"gpu0": 702_500}), ["gpu0"])
    sampler.read()
    t = sampler.samples[0].t
    timer = types.SimpleNamespace(intervals={"step": [(t - 1, t + 1)]})
    record = _clock_record(sampler, timer, {"step": {"tflops": None}}, None, None)
    assert record["phases"]["step"]["power_w"] == {"median": 702.5, "max": 702.5, "reading": INSTANT}


def test_the_thread_samples_until_the_block_ends_then_shuts_nvml_down() -> None:
    nvml = _FakeNVML()
    with ClockSampler(nvml, ["gpu0"], period_s=0.005) as sampler:
        time.sleep(0.1)
    n = len(sampler.samples)
    assert n >= 3 and nvml.shut
    times = [s.t for s in sampler.samples]
    assert times == sorted(times)
    time.sleep(0.02)
    assert len(sampler.samples) == n  # stopped


def test_no_sampler_says_why(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    assert open_sampler([0], None) == "not sampled: the nvidia-ml-py package (pynvml) is not installed"

    nvml = _FakeNVML()

    def no_driver():
        raise nvml.NVMLError("Driver Not Loaded")

    nvml.nvmlInit = no_driver
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    assert open_sampler([0], None) == "not sampled: NVML did not start (Driver Not Loaded)"

    nvml.nvmlInit = lambda: None
    nvml.nvmlDeviceGetHandleByIndex = lambda i: f"gpu{i}"
    nvml.nvmlDeviceGetHandleByUUID = lambda u: u
    assert open_sampler([1], ["3", "5"]).handles == ["gpu5"]  # the visible list's second: physical 5
    assert open_sampler([0], ["GPU-8f1e"]).handles == ["GPU-8f1e"]
    reason = open_sampler([0], ["MIG-1234"])
    assert reason.startswith("not sampled: NVML has no handle for devices [0] of CUDA_VISIBLE_DEVICES=['MIG-1234']")
    assert nvml.shut


def test_a_cpu_run_records_no_clock() -> None:
    from harness.timing.runner import run
    from harness.timing.spec import RunSpec

    doc = run(RunSpec(backend="torch", model="tiny", ctx=16, batch=1, device="cpu", warmup=1, steps=1))
    assert doc["status"] == "ok" and "gpu_clocks" not in doc


def test_each_process_samples_the_gpus_it_computes_on(monkeypatch) -> None:
    """A one-process run samples its first --data-parallel devices; a rank of a backend with a
    process per device its LOCAL_RANK's; a CPU run none."""
    from harness import backends
    from harness.timing import runner
    from harness.timing.spec import RunSpec

    asked = []
    monkeypatch.setattr(runner, "open_sampler", lambda devices, visible: asked.append(devices) or "stand-in")
    monkeypatch.setenv("LOCAL_RANK", "3")
    jax, torch = backends.get("jax"), backends.get("torch")
    assert jax.one_process and not torch.one_process
    assert runner._clock_sampler(RunSpec(backend="jax", model="tiny", ctx=16, device="cuda", data_parallel=2), jax) == "stand-in"
    runner._clock_sampler(RunSpec(backend="torch", model="tiny", ctx=16, device="cuda", data_parallel=4), torch)
    runner._clock_sampler(RunSpec(backend="torch", model="tiny", ctx=16, device="cuda"), torch)
    assert asked == [[0, 1], [3], [0]]
    assert runner._clock_sampler(RunSpec(backend="torch", model="tiny", ctx=16, device="cpu"), torch) is None


GPU = Path(__file__).parent / "data" / "gpu_clocks"  # harness.run of the small model on one H200
GALLERY = Path(__file__).parents[1] / "results" / "mfu" / "h200" / "clock"  # the large model's step, batch 32


def _doc(name: str) -> dict:
    return json.loads(next(p for p in (GPU / f"{name}.json", GALLERY / f"{name}.json") if p.exists()).read_text())


def test_a_real_run_s_clock_lines_hold_its_own_figures() -> None:
    """JAX's fused step at batch 32 on one H200: at its power cap throughout, its clock well below
    the datasheet peak's; each figure of the line from the document's own fields."""
    from harness.reports.run import format_result

    doc = _doc("jax-b32")
    clock, phase = doc["gpu_clocks"]["phases"]["fused_step"], doc["phases"]["fused_step"]
    mhz = clock["sm_mhz"]
    assert clock["samples"] > len(phase["times_ms"])  # a 400 ms step holds many 20 ms samples
    assert len(clock["call_mhz"]) == len(phase["times_ms"])
    assert all(mhz["min"] <= m <= mhz["max"] for m in clock["call_mhz"])
    # MFU at the clock held: the document's MFU with the peak scaled from 1830 MHz to it.
    assert clock["mfu_at_clock"] == pytest.approx(phase["mfu"] * 1830 / mhz["median"], rel=1e-9)
    assert clock["mfu_at_clock"] > phase["mfu"] * 1.1 and clock["power_capped"] == 1.0
    r = statistics.correlation(phase["times_ms"], clock["call_mhz"])
    assert r < -0.7  # the slower steps ran at the lower clocks
    (line,) = [x for x in format_result(doc).splitlines() if x.startswith("GPU clock over the measured fused_step")]
    assert line == (f"GPU clock over the measured fused_step calls: {mhz['median']:.0f} MHz median ({mhz['min']}-"
                    f"{mhz['max']}), {clock['power_w']['median']:.0f} W (1 s mean), at the power cap in 100% of samples; MFU at "
                    f"that clock {clock['mfu_at_clock']:.1%} (the datasheet peak's clock: 1830 MHz); its calls' spread "
                    f"follows the clock (r = {r:.2f} between time and clock over 10 calls)")


def test_a_run_of_one_process_per_device_names_rank_0_s_gpu() -> None:
    from harness.reports.run import clock_lines

    doc = _doc("torch-small-1")
    doc["ranks"] = [{"rank": 0, "gpu_clocks": doc["gpu_clocks"]}, {"rank": 1, "gpu_clocks": doc["gpu_clocks"]}]
    (line,) = clock_lines(doc)
    assert line.startswith("rank 0's GPU clock over the measured step calls: 1980 MHz median")


def test_a_small_step_at_a_steady_clock_gives_no_correlation() -> None:
    from harness.reports.run import format_result

    doc = _doc("torch-small-1")
    clock = doc["gpu_clocks"]["phases"]["step"]
    assert clock["sm_mhz"]["min"] == clock["sm_mhz"]["max"] and not clock["power_capped"]
    text = format_result(doc)
    assert "GPU clock over the measured step calls: 1980 MHz median (1980-1980)" in text and "r = " not in text


def test_a_failed_or_unsampled_run_says_why() -> None:
    from harness.reports.run import clock_lines

    assert clock_lines({"gpu_clocks": {"not_sampled": "not sampled: NVML did not start (x)"}}) == [
        "GPU clock: not sampled: NVML did not start (x)"]
    assert clock_lines({"phases": {}}) == []


def test_the_compare_answer_gives_each_backend_s_clock() -> None:
    from harness.reports.compare_answer import compare_findings

    summary = {"runs": {"jax": _doc("jax-b32"), "torch-compile": _doc("torch-compile-b32")}}
    (line,) = [f.text for f in compare_findings(summary) if f.text.startswith("GPU clock")]
    jax, tc = (summary["runs"][b]["gpu_clocks"]["phases"][p]["sm_mhz"]["median"]
               for b, p in (("jax", "fused_step"), ("torch-compile", "step")))
    assert line.startswith(f"GPU clock over the measured steps: jax {jax:.0f} MHz median")
    assert f"; torch-compile {tc:.0f} MHz median" in line
    summary["runs"]["jax"].update(status="error", error={"phase": "fused_step", "message": "planted"})
    (line,) = [f.text for f in compare_findings(summary) if f.text.startswith("GPU clock")]
    assert "jax" not in line


def test_the_diff_sets_the_two_sides_clocks_side_by_side(tmp_path) -> None:
    from harness.diffs.decompose import diff_runs
    from harness.diffs.inputs import resolve_one
    from harness.reports.diff import sentences

    a, b = GPU / "torch-small-1.json", GPU / "torch-small-2.json"
    same = diff_runs(resolve_one(a), resolve_one(b))
    watts = [json.loads(p.read_text())["gpu_clocks"]["phases"]["step"]["power_w"]["median"] for p in (a, b)]
    assert same.clocks == {"a": {"mhz": 1980, "runs": [1980], "watts": watts[0], "capped": 0.0, "reading": MEAN},
                           "b": {"mhz": 1980, "runs": [1980], "watts": watts[1], "capped": 0.0, "reading": MEAN}}
    assert (f"GPU clock over the compared steps: B's median 1980 MHz ({watts[1]:.0f} W (1 s mean), at the power cap "
            f"in 0% of samples) against A's 1980 MHz ({watts[0]:.0f} W (1 s mean), at the power cap in 0% of samples): "
            "the same within "
            "1%, so the gap is not the clock's.") in sentences(same)
    doc = json.loads(b.read_text())
    doc["gpu_clocks"]["phases"]["step"]["sm_mhz"]["median"] = 1881  # 5% lower
    doc["gpu_clocks"]["phases"]["step"].update(power_w={"median": 699.6, "max": 712.0, "reading": INSTANT},
                                               power_capped=0.96)
    lower = tmp_path / "lower.json"
    lower.write_text(json.dumps(doc))
    (line,) = [s for s in sentences(diff_runs(resolve_one(a), resolve_one(lower))) if s.startswith("GPU clock")]
    assert line.startswith("GPU clock over the compared steps: B's median 1881 MHz (700 W, at the power cap in 96% of "
                           "samples) against A's 1980 MHz")
    step = diff_runs(resolve_one(a), resolve_one(lower)).step
    at_a = step.b_ms * 1881 / 1980  # B's cycles at A's clock
    assert line.endswith("B's 5.0% lower; a step bound by the GPU's clock takes about that much longer with the "
                         f"same code; at A's clock B's would take about {at_a:.3f} ms (its time x B's clock / A's), "
                         f"{abs(at_a / step.a_ms - 1):.1%} {'more' if at_a > step.a_ms else 'less'} than A's "
                         f"{step.a_ms:.3f} ms.")
    assert at_a < step.b_ms and abs(at_a / step.b_ms - 0.95) < 1e-9
    del doc["gpu_clocks"]["phases"]["step"]["power_w"]  # a run that read no power: its clock alone
    lower.write_text(json.dumps(doc))
    (line,) = [s for s in sentences(diff_runs(resolve_one(a), resolve_one(lower))) if s.startswith("GPU clock")]
    assert line.startswith("GPU clock over the compared steps: B's median 1881 MHz against A's 1980 MHz (")
    del doc["gpu_clocks"]
    lower.write_text(json.dumps(doc))
    assert diff_runs(resolve_one(a), resolve_one(lower)).clocks == {}  # one side without: no sentence


def test_the_gallery_table_holds_each_run_s_figures() -> None:
    from harness.reports.doc_blocks import clock_table

    lines = clock_table(GALLERY, GALLERY.parents[2]).splitlines()
    names = sorted(p.stem for p in GALLERY.glob("*.json"))
    assert len(lines) == 2 + len(names) >= 4  # header, rule, one row per run
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]] for line in lines[2:]}
    order = []
    for name in names:
        doc = _doc(name)
        step = "fused_step" if "fused_step" in doc["phases"] else "step"
        clock, phase = doc["gpu_clocks"]["phases"][step], doc["phases"][step]
        mhz, batch = clock["sm_mhz"], doc["options"]["batch"]
        r = statistics.correlation(phase["times_ms"], clock["call_mhz"])
        assert rows[f"`{name}.json`"] == [
            f"`{name}.json`", doc["options"]["backend"], str(batch), step, f"{phase['median_ms']:.1f}",
            f"{phase['mfu']:.1%}", f"{mhz['median']:.0f} ({mhz['min']}-{mhz['max']})",
            f"{clock['power_w']['median']:.0f} W (1 s mean)", f"{clock['power_capped']:.0%}",
            f"{phase['mfu'] * 1830 / mhz['median']:.1%}", f"{r:.2f}"]
        order.append((doc["options"]["backend"], batch, f"`{name}.json`"))
    assert list(rows) == [name for *_, name in sorted(order)]  # by backend, then batch


def test_a_sweep_s_best_cell_says_its_clock(tmp_path) -> None:
    """A sweep over batch whose cells sampled their clocks (the gallery's JAX runs as its
    cells): the best cell's row and the answer give the clock and the MFU at that clock; every
    cell's clock is in cells.csv."""
    import csv

    from harness import sweep

    out = tmp_path / "s"
    out.mkdir()
    sweep_doc = json.loads((GALLERY.parent / "jax" / "sweep.json").read_text())
    sweep_doc["options"]["batch"] = 8
    sweep_doc["axes"]["batches"] = [8, 16, 32]
    (out / "sweep.json").write_text(json.dumps(sweep_doc))
    docs = {b: _doc(f"jax-b{b}") for b in (8, 16, 32)}
    with open(out / "cells.jsonl", "w") as f:
        for b, doc in docs.items():
            f.write(json.dumps({"schema": "harness.sweep.cell/1", "key": "large:1024:jax:bf16" + ("" if b == 8 else f":b{b}"),
                                "cell": {"model": "large", "ctx": 1024, "backend": "jax", "dtype": "bf16", "warmup": None,
                                         "batch": None if b == 8 else b, "data_parallel": None},
                                "status": "ok", "reason": None, "exit_code": 0, "wall_s": 1.0, "log": "x.log",
                                "profile": None, "gpu": None, "result": doc}) + "\n")
    assert sweep.main(["--render", str(out)]) == 0
    report = (out / "report.md").read_text()
    best = docs[32]["gpu_clocks"]["phases"]["fused_step"]
    mfu = docs[32]["phases"]["fused_step"]["mfu"]
    assert (f"best whole-step MFU per device: jax bf16 {mfu:.1%} (at {best['sm_mhz']['median']:.0f} MHz: "
            f"{best['mfu_at_clock']:.1%} at that clock)") in report
    assert f"| {100 * mfu:.1f}% |" in report and f"| {best['sm_mhz']['median']:.0f} | {100 * best['mfu_at_clock']:.1f}% |" in report
    with open(out / "cells.csv") as f:
        rows = {int(r["batch"]): r for r in csv.DictReader(f)}
    for b, doc in docs.items():
        clock = doc["gpu_clocks"]["phases"]["fused_step"]
        assert float(rows[b]["fused_step_sm_mhz"]) == clock["sm_mhz"]["median"]
        assert float(rows[b]["fused_step_mfu_at_clock"]) == pytest.approx(clock["mfu_at_clock"], rel=1e-12)
