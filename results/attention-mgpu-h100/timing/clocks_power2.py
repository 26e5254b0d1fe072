"""SM clock and board power while each implementation runs a sustained loop of one pass,
and its time per call cold (after idling) vs hot. usage: clocks_power2.py d:seq:c|n ..."""
import os, subprocess, statistics, sys, time
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax
from harness import bench_attention as ba

smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active",
                        "--format=csv,noheader,nounits", "-lms", "20"], stdout=subprocess.PIPE, text=True)
samples = []
import threading
def reader():
    for line in smi.stdout:
        samples.append((time.time(), line.strip()))
threading.Thread(target=reader, daemon=True).start()

def window(t0, t1):
    got = [s for t, s in samples if t0 <= t <= t1]
    clocks = [float(s.split(",")[1]) for s in got]
    power = [float(s.split(",")[2]) for s in got]
    temp = [float(s.split(",")[3]) for s in got]
    reasons = sorted({s.split(",")[4].strip() for s in got})
    if not got:
        return "no samples"
    return f"clock {statistics.median(clocks):.0f} MHz power {statistics.median(power):.0f} W temp {max(temp):.0f} C throttle {reasons}"

CELLS = [(int(d), int(s), c == "c") for d, s, c in (x.split(":") for x in sys.argv[1:])]
for d, seq, causal in CELLS:
    cell = dict(batch=16384 // seq, heads=2048 // d, seq=seq, head_dim=d, dtype="bfloat16", causal=causal)
    built = {}
    for impl in ("pallas_mosaic", "jax_cudnn", "torch_sdpa_cudnn"):
        builder = ba._build_torch if impl.startswith("torch") else ba._build_jax
        thunks, sync, timer = builder(impl, cell, "gpu")
        for p in ("fwd", "bwd"):
            built[(impl, p)] = (thunks[p], sync, timer)
            for _ in range(3):
                sync(thunks[p]())
    for (impl, p), (th, sync, timer) in built.items():
        time.sleep(2.0)  # idle: cool down
        cold = ba.repeat_ms(th, sync, timer, max(1, int(3 / 1.0)))
        n = ba.calls_per_repeat(th, sync, timer, 0, 25)
        t0 = time.time()
        hot = []
        while time.time() - t0 < 2.0:
            hot.append(ba.repeat_ms(th, sync, timer, n))
        t1 = time.time()
        print(f"d={d} s={seq} causal={causal} {p} {impl:17s} cold(3 calls) {cold:.3f} ms | sustained 2 s: median {statistics.median(hot):.3f} ms "
              f"first {hot[0]:.3f} last {hot[-1]:.3f} | {window(t0 + 0.5, t1)}", flush=True)
    built = None
    ba._release_memory()
smi.terminate()
