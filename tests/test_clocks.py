"""The GPU clock sampler (harness.timing.clocks): samples kept by the timer's intervals, the
figures per phase, the sampler's thread against a stand-in NVML, and why there is no sampler."""

from __future__ import annotations

import sys
import time
import types

import pytest

from harness.common.hardware import boost_mhz, peak_tflops
from harness.timing import clocks
from harness.timing.clocks import POWER_CAP, ClockSampler, Sample, open_sampler, peak_at_clock, summarize


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
    assert step["power_w"] == {"median": 700.0, "max": 700.0}
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
    assert clocks.SOURCE.startswith("NVML")
