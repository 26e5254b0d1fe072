"""Time, energy and SM clock per FFN forward+backward, XLA's plain FFN against the epilogue
kernels, in short (3 calls) and long (40 calls) blocks: the profiler's timeline put the kernels'
FFN 8% ahead, the wall clock of 20-call blocks did not."""

import statistics
import threading
import time

import jax
import pynvml as nvml
from check_common import emit
from prof import args, ffns

nvml.nvmlInit()
dev = nvml.nvmlDeviceGetHandleByIndex(0)


def block(fn, calls):
    clocks, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            clocks.append(nvml.nvmlDeviceGetClockInfo(dev, nvml.NVML_CLOCK_SM))
            time.sleep(0.005)

    jax.block_until_ready(fn(*args))
    time.sleep(0.5)  # the same rest before every block
    th = threading.Thread(target=sample)
    e0, t0 = nvml.nvmlDeviceGetTotalEnergyConsumption(dev), time.perf_counter()
    th.start()
    for _ in range(calls):
        out = fn(*args)
    jax.block_until_ready(out)
    t1, e1 = time.perf_counter(), nvml.nvmlDeviceGetTotalEnergyConsumption(dev)
    stop.set()
    th.join()
    return (t1 - t0) / calls * 1e6, (e1 - e0) / calls, statistics.median(clocks) if clocks else None


for rnd in range(3):
    for calls in (3, 40):
        for name in ("xla", "vjp kernels", "vjp xla up, kernel down"):
            us, mj, mhz = block(ffns[name], calls)
            emit(round=rnd, calls=calls, ffn=name, us=round(us, 1), mj=round(mj, 1), sm_mhz=mhz)
