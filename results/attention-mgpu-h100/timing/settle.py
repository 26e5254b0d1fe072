"""How fast the SM clock and a pass's time per call settle after switching implementations
(power-cap controller's time constant). usage: settle.py d:seq:c|n"""
import ctypes, os, statistics, sys, threading, time
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
from harness import bench_attention as ba
nvml = ctypes.CDLL("libnvidia-ml.so.1"); assert nvml.nvmlInit_v2() == 0
dev = ctypes.c_void_p(); assert nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) == 0
samples = []
def poll():
    c = ctypes.c_uint()
    while True:
        nvml.nvmlDeviceGetClockInfo(dev, 1, ctypes.byref(c)); samples.append((time.perf_counter(), c.value)); time.sleep(0.0005)
threading.Thread(target=poll, daemon=True).start()
d, seq, c = sys.argv[1].split(":")
cell = dict(batch=16384 // int(seq), heads=2048 // int(d), seq=int(seq), head_dim=int(d), dtype="bfloat16", causal=c == "c")
E = {}
for impl in ("torch_sdpa_flash", "pallas_mosaic", "torch_sdpa_cudnn"):
    builder = ba._build_torch if impl.startswith("torch") else ba._build_jax
    th, sync, timer = builder(impl, cell, "gpu")
    for p in ("fwd", "bwd"):
        E[(impl, p)] = (th[p], sync, timer, ba.calls_per_repeat(th[p], sync, timer, 2, 4))
def run(key, seconds):
    th, sync, timer, n = E[key]; out = []; t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t0 = time.perf_counter(); ms = ba.repeat_ms(th, sync, timer, n); out.append((t0, ms))
    return out
for before, after in ((("torch_sdpa_flash", "fwd"), ("pallas_mosaic", "fwd")), (("torch_sdpa_flash", "fwd"), ("torch_sdpa_cudnn", "fwd")),
                      (("pallas_mosaic", "bwd"), ("torch_sdpa_cudnn", "fwd")), (("torch_sdpa_cudnn", "bwd"), ("pallas_mosaic", "fwd")),
                      (None, ("pallas_mosaic", "fwd")), (None, ("torch_sdpa_cudnn", "fwd"))):
    if before: run(before, 1.0)
    else: time.sleep(1.0)
    t_switch = time.perf_counter(); got = run(after, 0.8)
    def clock(a, b):
        xs = [cl for t, cl in samples if t_switch + a <= t < t_switch + b]; return statistics.median(xs) if xs else 0
    def ms(a, b):
        xs = [m for t, m in got if t_switch + a <= t < t_switch + b]; return statistics.median(xs) if xs else 0
    bins = [(0, .01), (.01, .025), (.025, .05), (.05, .1), (.1, .2), (.2, .4), (.4, .8)]
    print(f"{before} -> {after}: " + " ".join(f"[{int(a*1e3)}-{int(b*1e3)}ms] {clock(a, b):.0f}MHz {ms(a, b):.3f}" for a, b in bins), flush=True)
