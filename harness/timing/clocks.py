"""The GPU's SM clock and power draw during the measured steps, sampled through NVML.

A GPU held at its power limit under sustained load lowers its SM clock (an H100 at 700 W ran
1560-1875 MHz, not its 1980 maximum), and the dense peak that MFU divides by is the
datasheet's, at its boost clock. A GPU-bound step's time moves with the clock it ran at: two
runs of the same code at clocks 2% apart differ by about as much, and a step that ran at
1,700 MHz cannot reach more than 1700/1830 of the datasheet peak.

`ClockSampler` reads each device's SM clock, power draw and the reasons NVML gives for a
clock below its maximum (the power cap, thermal slowdown) from a thread, every `PERIOD_S`.
The power is NVML's instantaneous reading where the driver gives it: `nvmlDeviceGetPowerUsage`
returns the mean of the last second on Ampere and newer, which over a step of tens of
milliseconds mixes in the gaps between phases and reads well under the cap that the clock is
held at. Each record says which reading it holds.
`summarize` keeps the samples that fall inside each phase's measured calls (the timer's
intervals, on the same `time.perf_counter` clock), so warm-up, compilation and the overhead
check are left out, and returns the figures per phase; rendering is the reports' business.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass

PERIOD_S = 0.02
SOURCE = f"NVML, every {PERIOD_S * 1e3:.0f} ms from a thread, samples inside the measured calls of each phase"
# NVML's clocks-event reasons (nvmlClocksEventReason*, bits of one mask): why the clock is
# below its maximum. The power cap is the usual one under a training step.
POWER_CAP = 0x4  # SwPowerCap
THERMAL = 0x8 | 0x20 | 0x40 | 0x80  # HwSlowdown, SwThermalSlowdown, HwThermalSlowdown, HwPowerBrakeSlowdown
POWER_INSTANT = 186  # NVML_FI_DEV_POWER_INSTANT: the draw now, in mW, through nvmlDeviceGetFieldValues
# What a record's power figures are (`power_w["reading"]`); a record without one read the mean.
INSTANT, MEAN = "instant", "1 s mean"


@dataclass(frozen=True)
class Sample:
    t: float  # time.perf_counter() when it was read
    device: int  # index among the sampled devices
    sm_mhz: int
    power_w: float | None  # None where NVML cannot read it
    reasons: int  # the clocks-event reasons mask (0 where NVML cannot read it)


class ClockSampler:
    """Samples `handles` (NVML device handles) every `period_s` from a daemon thread while
    the `with` block runs; `samples` holds what it read, in order."""

    def __init__(self, nvml, handles: list, period_s: float = PERIOD_S):
        self.nvml, self.handles, self.period_s = nvml, handles, period_s
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="gpu-clock-sampler", daemon=True)
        # nvmlDeviceGetCurrentClocksEventReasons replaced ...ThrottleReasons; older bindings have only the latter
        self._reasons = (getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                         or getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None))
        # One kind of reading for every device and sample: the instantaneous one where each
        # device gives it, else NVML's power usage (the last second's mean on current GPUs).
        self.power_reading = INSTANT if handles and all(self._instant(h) is not None for h in handles) else MEAN

    def __enter__(self) -> ClockSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.read()
            self._stop.wait(self.period_s)

    def read(self) -> None:
        """One sample of every device, stamped with `time.perf_counter()`."""
        nvml, t = self.nvml, time.perf_counter()
        for i, h in enumerate(self.handles):
            mhz = self._ask(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM)
            if mhz is None:
                continue
            milliwatts = (self._instant(h) if self.power_reading == INSTANT
                          else self._ask(nvml.nvmlDeviceGetPowerUsage, h))
            reasons = self._ask(self._reasons, h) if self._reasons else None
            self.samples.append(Sample(t, i, int(mhz), None if milliwatts is None else milliwatts / 1e3,
                                       int(reasons or 0)))

    def _ask(self, call, *args):
        """NVML's answer, or None where it cannot give one."""
        try:
            return call(*args)
        except self.nvml.NVMLError:
            return None

    def _instant(self, handle) -> int | None:
        """The device's instantaneous power draw in mW, or None where this driver or binding
        has no such field."""
        values = self._ask(getattr(self.nvml, "nvmlDeviceGetFieldValues", lambda *_: None), handle, [POWER_INSTANT])
        if not values or values[0].nvmlReturn != 0:  # NVML_SUCCESS
            return None
        return int(values[0].value.uiVal)


def open_sampler(devices: list[int], visible: list[str] | None) -> ClockSampler | str:
    """A sampler of `devices` (indices among the GPUs this process may use, `visible` being
    $CUDA_VISIBLE_DEVICES's names or None for every GPU), or the one-line reason there is none."""
    try:
        import pynvml as nvml
    except ImportError:
        return "not sampled: the nvidia-ml-py package (pynvml) is not installed"
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return f"not sampled: NVML did not start ({exc})"
    try:
        handles = [_handle(nvml, d if visible is None else visible[d]) for d in devices]
    except (IndexError, ValueError, nvml.NVMLError) as exc:
        nvml.nvmlShutdown()
        return f"not sampled: NVML has no handle for devices {devices} of CUDA_VISIBLE_DEVICES={visible} ({exc})"
    return ClockSampler(nvml, handles)


def _handle(nvml, name: int | str):
    """NVML's handle of a GPU named as CUDA_VISIBLE_DEVICES names it: an index or a UUID."""
    if isinstance(name, int) or name.isdigit():
        return nvml.nvmlDeviceGetHandleByIndex(int(name))
    if name.startswith("GPU-"):
        return nvml.nvmlDeviceGetHandleByUUID(name)
    raise ValueError(f"{name!r} is neither an index nor a GPU UUID (a MIG instance's clock is its GPU's)")


def summarize(samples: list[Sample], intervals: dict[str, list[tuple[float, float]]],
              power_reading: str = MEAN) -> dict:
    """Per phase, the samples read inside its measured calls (`intervals`: the timer's
    (start, end) per call): their count, the SM clock's median, min and max, the power's
    median and max (and which reading they are, `power_reading`), the share read at the power
    cap and in a thermal slowdown, and each call's mean clock (None for a call shorter than the
    sampling period that holds none)."""
    phases = {}
    for name, spans in intervals.items():
        inside = [[s for s in samples if a <= s.t <= b] for a, b in spans]
        held = [s for call in inside for s in call]
        rec: dict = {"samples": len(held)}
        if held:
            mhz = [s.sm_mhz for s in held]
            watts = [s.power_w for s in held if s.power_w is not None]
            rec.update(sm_mhz={"median": statistics.median(mhz), "min": min(mhz), "max": max(mhz)},
                       power_w={"median": statistics.median(watts), "max": max(watts), "reading": power_reading}
                       if watts else None,
                       power_capped=sum(bool(s.reasons & POWER_CAP) for s in held) / len(held),
                       thermal=sum(bool(s.reasons & THERMAL) for s in held) / len(held))
        rec["call_mhz"] = [statistics.fmean(s.sm_mhz for s in call) if call else None for call in inside]
        phases[name] = rec
    return {"source": SOURCE, "devices": len({s.device for s in samples}), "phases": phases}


MIN_CALLS_R = 5  # fewer calls with a clock give no correlation


def time_clock_r(times_ms: list[float], call_mhz: list[float | None]) -> float | None:
    """Pearson's r between the measured calls' times and their mean clocks, over the calls
    that hold a sample; None for fewer than `MIN_CALLS_R` or where either is constant. Near -1:
    the calls' spread is the clock's (a call at a lower clock took longer)."""
    pairs = [(t, m) for t, m in zip(times_ms, call_mhz) if m is not None]
    if len(pairs) < MIN_CALLS_R:
        return None
    try:
        return statistics.correlation([t for t, _ in pairs], [m for _, m in pairs])
    except statistics.StatisticsError:  # a constant series
        return None


def peak_at_clock(peak_tflops: float | None, boost_mhz: float | None, mhz: float | None) -> float | None:
    """The dense peak scaled from the datasheet's boost clock to `mhz` (tensor-core work per
    cycle is fixed), or None where a figure is missing."""
    return peak_tflops * mhz / boost_mhz if peak_tflops and boost_mhz and mhz else None


def watts_text(power_w: dict) -> str:
    """A power record's median in words: "690 W", or "448 W (1 s mean)" for NVML's mean of the
    last second (every record made before the instantaneous reading), which over short steps
    reads under the draw the power cap acts on."""
    reading = power_w.get("reading", MEAN)
    return f"{power_w['median']:.0f} W" + ("" if reading == INSTANT else f" ({reading})")
