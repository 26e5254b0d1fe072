"""Energy per call (NVML total-energy counter) and time per call of each implementation
in a sustained loop, at the board's power cap. usage: energy.py d:seq:c|n ..."""
import ctypes, os, statistics, sys, time
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
from harness import bench_attention as ba

nvml = ctypes.CDLL("libnvidia-ml.so.1")
assert nvml.nvmlInit_v2() == 0
dev = ctypes.c_void_p()
assert nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) == 0

def energy_mj():
    e = ctypes.c_ulonglong()
    assert nvml.nvmlDeviceGetTotalEnergyConsumption(dev, ctypes.byref(e)) == 0
    return e.value

def clock_mhz():
    c = ctypes.c_uint()
    nvml.nvmlDeviceGetClockInfo(dev, 1, ctypes.byref(c))  # NVML_CLOCK_SM
    return c.value

IMPLS = sys.argv[1].split(",")
CELLS = [(int(d), int(s), c == "c") for d, s, c in (x.split(":") for x in sys.argv[2:])]
for d, seq, causal in CELLS:
    cell = dict(batch=16384 // seq, heads=2048 // d, seq=seq, head_dim=d, dtype="bfloat16", causal=causal)
    for p in ("fwd", "bwd"):
        built = {}
        for impl in IMPLS:
            builder = ba._build_torch if impl.startswith("torch") else ba._build_jax
            thunks, sync, timer = builder(impl, cell, "gpu")
            built[impl] = (thunks[p], sync, timer)
            for _ in range(3):
                sync(thunks[p]())
        res = {impl: [] for impl in IMPLS}
        for rnd in range(3):
            for impl in IMPLS:
                th, sync, timer = built[impl]
                time.sleep(1.0)
                n = ba.calls_per_repeat(th, sync, timer, 0, 25)
                # warm into the cap, then measure ~1.5 s of back-to-back repeats
                t_end = time.time() + 0.5
                while time.time() < t_end:
                    ba.repeat_ms(th, sync, timer, n)
                e0, t0, calls, ms, clocks = energy_mj(), time.time(), 0, [], []
                while time.time() - t0 < 1.5:
                    ms.append(ba.repeat_ms(th, sync, timer, n)); calls += n; clocks.append(clock_mhz())
                e1, t1 = energy_mj(), time.time()
                res[impl].append(((e1 - e0) / calls, statistics.median(ms), (e1 - e0) / 1e3 / (t1 - t0), statistics.median(clocks)))
        base = IMPLS[-1]
        for impl in IMPLS:
            mj = statistics.median(r[0] for r in res[impl]); ms = statistics.median(r[1] for r in res[impl])
            w = statistics.median(r[2] for r in res[impl]); mhz = statistics.median(r[3] for r in res[impl])
            bmj = statistics.median(r[0] for r in res[base]); bms = statistics.median(r[1] for r in res[base])
            print(f"d={d} s={seq} causal={causal} {p} {impl:17s} {mj:8.2f} mJ/call {ms:7.3f} ms/call {w:4.0f} W {mhz:5.0f} MHz"
                  f" | vs {base}: energy {mj / bmj:.3f}x time {ms / bms:.3f}x", flush=True)
        built = None
        ba._release_memory()
