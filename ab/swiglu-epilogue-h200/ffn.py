"""The FFN's forward and backward through `swiglu_ffn` with the epilogue kernels on given tiles,
against XLA's plain FFN: correctness, then time, interleaved over three rounds."""


from check_common import emit, err, inputs, plain_ffn, step, timed

from pallas_kernels import swiglu as sw
from pallas_kernels.hopper import gated

UP = dict(  # GemmTiles fields: rows, tile_n, stages, bufs, tile_k, in_flight, pingpong, joint
    cooperative=(64, 128, 3, 2, 64, False, False, False),
    joint=(64, 256, 3, 2, 64, False, False, True),
    joint_pingpong=(128, 128, 4, 2, 64, True, True, True),
)
DOWN = dict(pingpong=(128, 128, 4, 2, 64, True, True))
COMBOS = [("cooperative", "pingpong"), ("joint", "pingpong"), ("joint_pingpong", "pingpong")]


def with_tiles(up, down):
    def kernels(backend):
        return (
            lambda x, w1, w3: gated._gemm_call(x, (w1, w3), transpose_b=True, n_out=3, epilogue=gated._up_epilogue,
                                               name="u", tiles=gated.GemmTiles(*up)),
            lambda dy, w2, h1, h3: gated._gemm_call(dy, (w2,), transpose_b=False, n_out=3,
                                                    epilogue=gated._down_epilogue, epi_inputs=(h1, h3), name="d",
                                                    tiles=gated.GemmTiles(*down)),
        )

    def ffn(*a):
        sw._kernels = kernels  # read when the custom VJP is traced
        return sw.swiglu_ffn(*a, backend="mosaic")

    return step(ffn)


x, w1, w2, w3, dy = inputs(32768, 1280, 5120)
ga = step(plain_ffn)(x, w1, w2, w3, dy)
ffns = {}
for up, down in COMBOS:
    name = f"up {up}, down {down}"
    try:
        fn = with_tiles(UP[up], DOWN[down])
        emit(check=name, rel_err=[err(a, b) for a, b in zip(fn(x, w1, w2, w3, dy), ga)])
        ffns[name] = fn
    except Exception as ex:  # noqa: BLE001
        emit(check=name, error=f"{type(ex).__name__}: {str(ex)[:300]}")
for _ in range(3):
    for name, fn in (("xla", step(plain_ffn)), *ffns.items()):
        emit(time=f"ffn fwd+bwd {name}", **timed(fn, x, w1, w2, w3, dy))
