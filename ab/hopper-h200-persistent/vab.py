"""Hopper A/B of kernel variants of one pass, interleaved rounds in one process.
usage: [PASS=fwd|bwd|fb] [ITERS=15] [LEAD_IN_MS=200] vab.py 'name:field=v,_SWITCH=v;...' B:H:S:D:c|n ...
field=v: MosaicBlockSizes fields; _NAME=v: the kernel module's switch, set while the variant is traced."""
import dataclasses, math, os, sys
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax, jax.numpy as jnp
from harness.attention import interleaved
from pallas_kernels.hopper import backward as bwdmod, forward as fwdmod
from pallas_kernels.hopper.tiles import MosaicBlockSizes
PASS = os.environ.get("PASS", "bwd")
ITERS, LEAD_IN_MS = int(os.environ.get("ITERS", "15")), float(os.environ.get("LEAD_IN_MS", "200"))
MODS = (bwdmod, fwdmod)

def parse(v):
    if v.lower() in ("true", "false"):
        return v.lower() == "true"
    return int(v) if v.lstrip("-").isdigit() else v

def max_diff(a, b):
    return max(float(jnp.max(jnp.abs(x.astype(jnp.float32) - y.astype(jnp.float32)))) for x, y in zip(a, b))

VARIANTS = {"default": {}}
for spec in filter(None, sys.argv[1].split(";")):
    name, fields = spec.split(":")
    VARIANTS[name] = {f.split("=")[0]: parse(f.split("=")[1]) for f in fields.split(",")}
for cell in sys.argv[2:]:
    B, H, S, D, c = cell.split(":")
    B, H, S, D, causal = int(B), int(H), int(S), int(D), c == "c"
    shape = (B, S, H, D)
    ks = jax.random.split(jax.random.key(0), 4)
    q, k, v, do = (jax.random.normal(kk, shape, jnp.float32).astype(jnp.bfloat16) for kk in ks)
    kw = dict(causal=causal, sm_scale=1 / math.sqrt(D))
    default = MosaicBlockSizes.get_default(D, S, causal)
    o, lse = jax.jit(lambda q, k, v: fwdmod.mosaic_forward(q, k, v, block_sizes=default, **kw))(q, k, v)
    entries, outs = {}, {}
    for name, ch in VARIANTS.items():
        ch = dict(ch)
        globs = {f: ch.pop(f) for f in list(ch) if f.startswith("_")}
        if "_REGS" in globs:  # two consumers' registers; the producer gets the rest of 504
            globs["_REGS"] = (globs["_REGS"], 504 - 2 * globs["_REGS"])
        saved = [(m, g, getattr(m, g)) for m in MODS for g in globs if hasattr(m, g)]
        for m, g, _ in saved:
            setattr(m, g, globs[g])
        try:
            blocks = dataclasses.replace(default, **ch)
            if PASS == "bwd":
                f = jax.jit(lambda o, lse, blocks=blocks: bwdmod.mosaic_backward(q, k, v, o, lse, do, block_sizes=blocks, **kw))
                args = (o, lse)
            elif PASS == "fwd":
                f = jax.jit(lambda q, k, v, blocks=blocks: fwdmod.mosaic_forward(q, k, v, block_sizes=blocks, **kw))
                args = (q, k, v)
            else:
                def fb(q, k, v, blocks=blocks):
                    o, lse = fwdmod.mosaic_forward(q, k, v, block_sizes=blocks, **kw)
                    return (o,) + tuple(bwdmod.mosaic_backward(q, k, v, o, lse, do, block_sizes=blocks, **kw))
                f = jax.jit(fb)
                args = (q, k, v)
            outs[name] = jax.block_until_ready(f(*args))
            rerun = max_diff(outs[name], jax.block_until_ready(f(*args)))
        except Exception as exc:
            print(f"{cell} {name} failed: {str(exc)[:800]}", flush=True)
            continue
        finally:
            for m, g, val in saved:
                setattr(m, g, val)
        entries[name] = (lambda f=f, args=args: f(*args), jax.block_until_ready, "wall")
        print(f"{cell} {name} compiled, rerun diff {rerun:.1e}", flush=True)
    got = interleaved.time_interleaved(entries, warmup=2, iters=ITERS, min_batch_ms=25, lead_in_ms=LEAD_IN_MS)
    base = got["default"][0]
    print(f"{cell} {PASS}: " + " | ".join(
        f"{n} {t[0]:.4f} ms [{t[1]:.4f},{t[2]:.4f}] ({base / t[0]:.4f}x, diff "
        + "/".join(f"{max_diff([x], [y]):.1e}" for x, y in zip(outs[n], outs['default'])) + ")"
        if not isinstance(t, Exception) else f"{n} FAILED {t}" for n, t in got.items()), flush=True)
