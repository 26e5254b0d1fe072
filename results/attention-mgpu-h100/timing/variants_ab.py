"""Hopper A/B of block-size variants of one pass, interleaved rounds in one process.
usage: [PASS=fwd|bwd] [ITERS=21] [LEAD_IN_MS=0] variants_ab.py 'name:field=v,field=v;name2:...' d:seq:c|n ...
(default always included). Two pseudo-fields: regs=N gives each of the two
consumers N registers and the producer 504 - 2N while the variant is traced;
_NAME=value sets the kernel module's switch _NAME likewise (switches that
existed at the commits named in the logs). The backward reports each variant's largest difference from the
default's gradients and from its own second run. MGPU_SMEM_LIMIT overrides the module's
shared-memory budget."""
import dataclasses, math, os, sys
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax, jax.numpy as jnp
from harness import bench_attention as bench
from pallas_kernels import flash_attention_mgpu as mgpu
if os.environ.get("MGPU_SMEM_LIMIT"):
    mgpu._SMEM_LIMIT = int(os.environ["MGPU_SMEM_LIMIT"])
PASS = os.environ.get("PASS", "fwd")
ITERS, LEAD_IN_MS = int(os.environ.get("ITERS", "21")), float(os.environ.get("LEAD_IN_MS", "0"))

def parse(v):
    if v.lower() in ("true", "false"):
        return v.lower() == "true"
    return int(v) if v.lstrip("-").isdigit() else v

def max_diff(a, b):
    return max(float(jnp.max(jnp.abs(x.astype(jnp.float32) - y.astype(jnp.float32)))) for x, y in zip(a, b))

VARIANTS = {"default": {}}
for spec in sys.argv[1].split(";"):
    name, fields = spec.split(":")
    VARIANTS[name] = {f.split("=")[0]: parse(f.split("=")[1]) for f in fields.split(",")}
cells = [(int(d), int(s), c == "c") for d, s, c in (x.split(":") for x in sys.argv[2:])]
for d, seq, causal in cells:
    shape = (16384 // seq, seq, 2048 // d, d)
    ks = jax.random.split(jax.random.key(0), 4 if PASS == "bwd" else 3)
    q, k, v, *do = (jax.random.normal(kk, shape, jnp.float32).astype(jnp.bfloat16) for kk in ks)
    kw = dict(causal=causal, sm_scale=1 / math.sqrt(d))
    default = mgpu.MosaicBlockSizes.get_default(d, seq, causal)
    if PASS == "bwd":
        o, lse = jax.jit(lambda q, k, v: mgpu.mosaic_forward(q, k, v, block_sizes=default, **kw))(q, k, v)
    entries, outs, rerun = {}, {}, {}
    for name, ch in VARIANTS.items():
        try:
            ch = dict(ch)
            regs = ch.pop("regs", None)  # consumers' registers (2 consumers: the producer gets 504 - 2 * regs)
            saved = mgpu._CONSUMER_REGISTERS, mgpu._PRODUCER_REGISTERS
            if regs:
                mgpu._CONSUMER_REGISTERS, mgpu._PRODUCER_REGISTERS = regs, 504 - 2 * regs
            globs = {f: ch.pop(f) for f in list(ch) if f.startswith("_")}  # module switches, set while tracing
            saved_globs = {f: getattr(mgpu, f) for f in globs}
            for g, val in globs.items():
                setattr(mgpu, g, val)
            blocks = dataclasses.replace(default, **ch)
            if PASS == "bwd":
                f = jax.jit(lambda o, lse, blocks=blocks: mgpu.mosaic_backward(q, k, v, o, lse, do[0], block_sizes=blocks, **kw))
                args = (o, lse)
            else:
                f = jax.jit(lambda q, k, v, blocks=blocks: mgpu.mosaic_forward(q, k, v, block_sizes=blocks, **kw)[0])
                args = (q, k, v)
            try:
                outs[name] = jax.block_until_ready(f(*args))
            finally:
                mgpu._CONSUMER_REGISTERS, mgpu._PRODUCER_REGISTERS = saved
                for g, val in saved_globs.items():
                    setattr(mgpu, g, val)
            if PASS == "bwd":
                rerun[name] = max_diff(outs[name], jax.block_until_ready(f(*args)))
        except Exception as exc:
            print(f"d={d} seq={seq} causal={causal} {name} failed: {str(exc)[:600]}", flush=True); continue
        entries[name] = (lambda f=f, args=args: f(*args), jax.block_until_ready, "wall")
    got = bench.time_interleaved(entries, warmup=2, iters=ITERS, min_batch_ms=25, lead_in_ms=LEAD_IN_MS)
    base = got["default"][0]
    if PASS == "bwd":
        diff = {n: max_diff(outs[n], outs["default"]) for n in outs}
    else:
        diff = {n: float(jnp.max(jnp.abs(outs[n].astype(jnp.float32) - outs["default"].astype(jnp.float32)))) for n in outs}
    print(f"d={d} seq={seq} causal={causal}: " + " | ".join(
        f"{n} {t[0]:.4f} ms [{t[1]:.4f},{t[2]:.4f}] ({base / t[0]:.3f}x, diff {diff[n]:.1e}"
        + (f", rerun {rerun[n]:.1e})" if n in rerun else ")") if not isinstance(t, Exception) else f"{n} FAILED {t}"
        for n, t in got.items()), flush=True)
