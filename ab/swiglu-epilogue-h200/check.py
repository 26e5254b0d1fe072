"""The SwiGLU epilogue kernels on the GPU: correctness against the references, and time against
XLA at the step's FFN shape (large, 32 x 1024 tokens)."""

import traceback

import jax
from check_common import emit, err, inputs, plain_ffn, step, timed, xla_down, xla_up

from pallas_kernels import swiglu as sw
from pallas_kernels.hopper import gated

for M, D, F in ((256, 128, 256), (32768, 1280, 5120)):
    x, w1, w2, w3, dy = inputs(M, D, F)
    try:
        got = gated.gate_up(x, w1, w3)
        ref = sw.gate_up_reference(x, w1, w3)
        emit(check="gate_up", shape=[M, D, F], rel_err=[err(a, b) for a, b in zip(got, ref)])
    except Exception as e:
        emit(check="gate_up", shape=[M, D, F], error=f"{type(e).__name__}: {str(e)[:1500]}")
        traceback.print_exc()
    h1, h3, _ = sw.gate_up_reference(x, w1, w3)
    try:
        got = gated.gate_down(dy, w2, h1, h3)
        ref = sw.gate_down_reference(dy, w2, h1, h3)
        emit(check="gate_down", shape=[M, D, F], rel_err=[err(a, b) for a, b in zip(got, ref)])
    except Exception as e:
        emit(check="gate_down", shape=[M, D, F], error=f"{type(e).__name__}: {str(e)[:1500]}")
        traceback.print_exc()

M, D, F = 32768, 1280, 5120
x, w1, w2, w3, dy = inputs(M, D, F)
h1, h3, _ = sw.gate_up_reference(x, w1, w3)
rows = {}
for name, fn, args in (
    ("up xla", jax.jit(xla_up), (x, w1, w3)),
    ("up mosaic", gated.gate_up, (x, w1, w3)),
    ("down xla", jax.jit(xla_down), (dy, w2, h1, h3)),
    ("down mosaic", gated.gate_down, (dy, w2, h1, h3)),
    ("ffn fwd+bwd xla", step(plain_ffn), (x, w1, w2, w3, dy)),
    ("ffn fwd+bwd mosaic", step(lambda *a: sw.swiglu_ffn(*a, backend="mosaic")), (x, w1, w2, w3, dy)),
):
    try:
        rows[name] = timed(fn, *args)
        emit(time=name, **rows[name])
    except Exception as e:
        emit(time=name, error=f"{type(e).__name__}: {str(e)[:300]}")
try:
    ga = step(plain_ffn)(x, w1, w2, w3, dy)
    gb = step(lambda *a: sw.swiglu_ffn(*a, backend="mosaic"))(x, w1, w2, w3, dy)
    emit(check="ffn y, grads mosaic vs plain xla", rel_err=[err(a, b) for a, b in zip(gb, ga)])
    gr = step(lambda *a: sw.swiglu_ffn(*a, backend="reference"))(x, w1, w2, w3, dy)
    emit(check="ffn y, grads reference vs plain xla", rel_err=[err(a, b) for a, b in zip(gr, ga)])
except Exception as e:
    emit(check="ffn grads", error=f"{type(e).__name__}: {str(e)[:300]}")
VARIANTS = {
    # (rows, tile_n, stages, bufs, tile_k, in_flight, pingpong), gated.GemmTiles's fields in order
    "up": [
        (64, 128, 3, 2, 64, False, False),
        (128, 64, 4, 2, 64, False, True),
        (128, 64, 4, 2, 64, True, True),
        (64, 128, 4, 2, 64, False, True),
    ],
    "down": [
        (128, 128, 3, 2, 64, False, False),
        (128, 128, 4, 2, 64, False, True),
        (128, 128, 4, 2, 64, True, True),
        (64, 128, 4, 2, 64, False, True),
    ],
}


def variant(kind, t):
    tiles = gated.GemmTiles(*t)
    if kind == "up":
        return jax.jit(
            lambda x, w1, w3: gated._gemm_call(
                x, (w1, w3), transpose_b=True, n_out=3, epilogue=gated._up_epilogue, name="u", tiles=tiles
            )
        ), (x, w1, w3)
    return jax.jit(
        lambda dy, w2, h1, h3: gated._gemm_call(
            dy,
            (w2,),
            transpose_b=False,
            n_out=3,
            epilogue=gated._down_epilogue,
            epi_inputs=(h1, h3),
            name="d",
            tiles=tiles,
        )
    ), (dy, w2, h1, h3)


refs = {"up": sw.gate_up_reference(x, w1, w3), "down": sw.gate_down_reference(dy, w2, h1, h3)}
for rnd in range(2):
    for kind in ("up", "down"):
        for t in VARIANTS[kind]:
            try:
                fn, args = variant(kind, t)
                e = [err(a, b) for a, b in zip(fn(*args), refs[kind])] if rnd == 0 else None
                label = "rows,tile_n,stages,bufs,tile_k,in_flight,pingpong"
                emit(time=f"{kind} {label}={t}", rel_err=e, **timed(fn, *args))
            except Exception as ex:
                emit(time=f"{kind} {t}", error=f"{type(ex).__name__}: {str(ex)[:300]}")
        emit(
            time=f"{kind} xla",
            **timed(
                jax.jit(xla_up) if kind == "up" else jax.jit(xla_down),
                *((x, w1, w3) if kind == "up" else (dy, w2, h1, h3)),
            ),
        )

