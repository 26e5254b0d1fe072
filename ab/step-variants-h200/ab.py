"""Interleaved A/B of model variants (XFPROF_EXP) on JAX's fused step, one process."""
import gzip, json, os, statistics, sys, time
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
import numpy as np, jax
from harness.config import get_config
from harness.backends.jax.session import JaxSession

variants = sys.argv[1].split(";")
batch, rounds, per, out = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
model = sys.argv[6] if len(sys.argv) > 6 else "large"
os.makedirs(out, exist_ok=True)
jax.config.update("jax_compilation_cache_dir", "/tmp/jaxcache60")
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
cfg = get_config(model, attention="fused")
tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, 1025))
doc = {"batch": batch, "variants": variants, "device": jax.devices()[0].device_kind, "jax": jax.__version__,
       "compile_s": {}, "memory": {}, "rounds": [], "kernels": {}}
save = lambda: json.dump(doc, open(f"{out}/ab.json", "w"), indent=1)
sessions = {}
for v in variants:
    os.environ["XFPROF_EXP"] = "" if v == "base" else v
    t = time.perf_counter()
    s = JaxSession(cfg, tokens, device=os.environ.get("AB_DEVICE", "cuda"), dtype="bf16", seed=0)
    try:
        s.sync(s.fused_step())
    except Exception as e:  # noqa
        doc["compile_s"][v] = f"failed: {str(e)[:300]}"
        print(v, "failed", str(e)[:300], flush=True)
        save()
        continue
    doc["compile_s"][v] = time.perf_counter() - t
    for _ in range(3):
        s.fused_step()
    s.sync()
    try:
        spec = lambda tree: jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tree)
        comp = s._fused.lower(spec(s.state), spec(s.opt_state), s.inputs, s.targets).compile()
        m = comp.memory_analysis()
        doc["memory"][v] = {k: int(getattr(m, f"{k}_size_in_bytes")) for k in ("argument", "output", "temp", "alias")}
        with gzip.open(f"{out}/hlo-{v.replace(',', '+')}.txt.gz", "wt") as f:
            f.write(comp.as_text())
    except Exception as e:  # noqa
        print(v, "hlo failed", e, flush=True)
    sessions[v] = s
    print(v, "ready", doc["compile_s"][v], doc["memory"].get(v), flush=True)
    save()
names = list(sessions)
for r in range(rounds):
    order = names[r % len(names):] + names[:r % len(names)]
    row = {}
    for v in order:
        s = sessions[v]
        s.sync()
        t = time.perf_counter()
        for _ in range(per):
            s.fused_step()
        s.sync()
        row[v] = (time.perf_counter() - t) / per * 1e3
    doc["rounds"].append(row)
    print(r, {k: round(x, 2) for k, x in row.items()}, flush=True)
    save()
summary = {}
for v in names:
    xs = [row[v] for row in doc["rounds"]]
    rat = [row[v] / row["base"] for row in doc["rounds"]] if "base" in names else []
    summary[v] = {"median_ms": statistics.median(xs), "min": min(xs), "max": max(xs),
                  "ratio_median": statistics.median(rat) if rat else None,
                  "ratio_min": min(rat) if rat else None, "ratio_max": max(rat) if rat else None}
    print(v, summary[v], flush=True)
doc["summary"] = summary
save()
# one profiled pair of steps per variant: kernel time by name
from jax.profiler import ProfileData
for v in names:
    d = f"/tmp/prof60/{v.replace(',', '+')}"
    s = sessions[v]
    s.sync()
    jax.profiler.start_trace(d)
    for _ in range(2):
        s.fused_step()
    s.sync()
    jax.profiler.stop_trace()
    path = next(os.path.join(a, f) for a, _, fs in os.walk(d) for f in fs if f.endswith(".xplane.pb"))
    pd = ProfileData.from_file(path)
    k = {}
    for plane in pd.planes:
        if not plane.name.startswith(os.environ.get("AB_PLANE", "/device:GPU")):
            continue
        doc.setdefault("lines", [l.name for l in plane.lines])
        for line in plane.lines:
            if "Stream" not in line.name and not os.environ.get("AB_PLANE"):
                continue
            for ev in line.events:
                k.setdefault(ev.name, [0, 0])
                k[ev.name][0] += ev.duration_ns / 2
                k[ev.name][1] += 0.5
        break
    doc["kernels"][v] = k
    print(v, "profiled", len(k), round(sum(x[0] for x in k.values()) / 1e6, 2), "ms/step", flush=True)
    save()
