"""How the host time of one jitted step grows with its number of arrays (same total bytes)."""
import json, os, statistics, sys, time
import jax, jax.numpy as jnp

TOTAL = 970_000_000
def run(n):
    sizes = [TOTAL // n] * n
    key = jax.random.PRNGKey(0)
    params = [jnp.full((s,), 0.01, jnp.float32) for s in sizes]
    m = [jnp.zeros_like(p) for p in params]
    v = [jnp.zeros_like(p) for p in params]
    a = jax.random.normal(key, (8192, 8192), jnp.bfloat16)
    def step(params, m, v, a):
        x = a
        for _ in range(40):  # ~ 40 x 1.1 TFLOP
            x = (x @ a).astype(jnp.bfloat16) * 0.01
        s = jnp.mean(x.astype(jnp.float32))
        out_p, out_m, out_v = [], [], []
        for p, mi, vi in zip(params, m, v):
            g = p * s
            mi = 0.9 * mi + 0.1 * g
            vi = 0.99 * vi + 0.01 * g * g
            out_p.append(p - 1e-3 * mi / (jnp.sqrt(vi) + 1e-8))
            out_m.append(mi); out_v.append(vi)
        return out_p, out_m, out_v, s
    f = jax.jit(step, donate_argnums=() if os.environ.get('NODONATE') else (0, 1, 2))
    for _ in range(3):
        params, m, v, s = f(params, m, v, a); s.block_until_ready()
    host, synced = [], []
    for _ in range(10):
        t0 = time.perf_counter()
        params, m, v, s = f(params, m, v, a)
        t1 = time.perf_counter()
        s.block_until_ready()
        t2 = time.perf_counter()
        host.append((t1 - t0) * 1e3); synced.append((t2 - t0) * 1e3)
    loops = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(10):
            params, m, v, s = f(params, m, v, a)
        jax.block_until_ready((params, s))
        loops.append((time.perf_counter() - t0) * 1e2)
    return {"n": n, "host_ms": statistics.median(host), "synced_ms": statistics.median(synced),
            "loop_ms": statistics.median(loops)}

if __name__ == "__main__":
    out = [run(int(n)) for n in sys.argv[1:]]
    for r in out:
        print(json.dumps({"flags": os.environ.get("XLA_FLAGS", ""), "nodonate": bool(os.environ.get("NODONATE")), **{k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}}))
