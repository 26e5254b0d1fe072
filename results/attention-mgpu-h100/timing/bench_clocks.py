"""The benchmark's interleaved rounds (harness.bench_attention.time_interleaved) with the SM clock
and board power polled through NVML every ~1 ms, attributed to the entry whose repeat was running.
Then the same entries each measured alone after 0.5 s of its own calls (its own steady state).
usage: bench_clocks.py impl,impl,... passes d:seq:c|n ..."""
import ctypes, os, statistics, sys, threading, time
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
from harness import bench_attention as ba

nvml = ctypes.CDLL("libnvidia-ml.so.1"); assert nvml.nvmlInit_v2() == 0
dev = ctypes.c_void_p(); assert nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) == 0
samples = []
def poll():
    c, p = ctypes.c_uint(), ctypes.c_uint()
    while True:
        nvml.nvmlDeviceGetClockInfo(dev, 1, ctypes.byref(c)); nvml.nvmlDeviceGetPowerUsage(dev, ctypes.byref(p))
        samples.append((time.perf_counter(), c.value, p.value / 1000)); time.sleep(0.001)
threading.Thread(target=poll, daemon=True).start()

def window(t0, t1):
    got = [(c, p) for t, c, p in samples if t0 <= t <= t1]
    return (statistics.median(c for c, _ in got), statistics.median(p for _, p in got)) if got else (0, 0)

impls, passes = sys.argv[1].split(","), sys.argv[2].split(",")
for d, seq, c in (x.split(":") for x in sys.argv[3:]):
    cell = dict(batch=16384 // int(seq), heads=2048 // int(d), seq=int(seq), head_dim=int(d), dtype="bfloat16", causal=c == "c")
    entries = {}
    for impl in impls:
        builder = ba._build_torch if impl.startswith("torch") else ba._build_jax
        thunks, sync, timer = builder(impl, cell, "gpu")
        entries.update({(impl, p): (thunks[p], sync, timer) for p in passes})
    calls = {k: ba.calls_per_repeat(*e, 2, 25) for k, e in entries.items()}
    keys = list(entries); log = {k: [] for k in keys}
    for rnd in range(9):
        shift = rnd % len(keys)
        for k in keys[shift:] + keys[:shift]:
            t0 = time.perf_counter(); ms = ba.repeat_ms(*entries[k], calls[k]); t1 = time.perf_counter()
            log[k].append((ms, *window(t0, t1)))
    print(f"-- d={d} seq={seq} causal={c}: interleaved rounds (as the benchmark)", flush=True)
    for k in keys:
        print(f"   {k[0]:17s} {k[1]:8s} {statistics.median(x[0] for x in log[k]):8.4f} ms  clock {statistics.median(x[1] for x in log[k]):5.0f} MHz  power {statistics.median(x[2] for x in log[k]):4.0f} W", flush=True)
    print(f"-- d={d} seq={seq} causal={c}: each alone, after 0.5 s of its own calls, 5 repeats", flush=True)
    for k in keys:
        th, sync, timer = entries[k]
        t_end = time.time() + 0.5
        while time.time() < t_end:
            ba.repeat_ms(th, sync, timer, calls[k])
        got = []
        for _ in range(5):
            t0 = time.perf_counter(); ms = ba.repeat_ms(th, sync, timer, calls[k]); t1 = time.perf_counter()
            got.append((ms, *window(t0, t1)))
        print(f"   {k[0]:17s} {k[1]:8s} {statistics.median(x[0] for x in got):8.4f} ms  clock {statistics.median(x[1] for x in got):5.0f} MHz  power {statistics.median(x[2] for x in got):4.0f} W", flush=True)
    entries = None; ba._release_memory()
