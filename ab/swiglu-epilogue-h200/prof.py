"""Where the FFN's time goes: XLA's plain FFN, the custom VJP on the jnp references, the
epilogue kernels, and XLA's forward with the backward's kernel; timed interleaved, then one
call of each under jax.profiler with its kernels summed by name."""

import collections
import glob
import sys
import tempfile

import jax
from check_common import emit, err, inputs, plain_ffn, step, timed

from pallas_kernels import swiglu as sw
from pallas_kernels.hopper import gated

UP = (64, 128, 3, 2, 64, False, False, False)
DOWN = (128, 128, 4, 2, 64, True, True)


def up_kernel(x, w1, w3):
    return gated._gemm_call(x, (w1, w3), transpose_b=True, n_out=3, epilogue=gated._up_epilogue, name="u",
                            tiles=gated.GemmTiles(*UP))


def down_kernel(dy, w2, h1, h3):
    return gated._gemm_call(dy, (w2,), transpose_b=False, n_out=3, epilogue=gated._down_epilogue,
                            epi_inputs=(h1, h3), name="d", tiles=gated.GemmTiles(*DOWN))


def with_kernels(up, down):
    def ffn(*a):
        sw._kernels = lambda backend: (up, down)
        return sw.swiglu_ffn(*a, backend="mosaic")

    return step(ffn)


x, w1, w2, w3, dy = inputs(32768, 1280, 5120)
args = (x, w1, w2, w3, dy)
ffns = {
    "xla": step(plain_ffn),
    "vjp references": with_kernels(sw.gate_up_reference, sw.gate_down_reference),
    "vjp kernels": with_kernels(up_kernel, down_kernel),
    "vjp xla up, kernel down": with_kernels(sw.gate_up_reference, down_kernel),
}
if __name__ == "__main__":
    ga = ffns["xla"](*args)
    for name, fn in ffns.items():
        emit(check=name, rel_err=[err(a, b) for a, b in zip(fn(*args), ga)])
    for _ in range(3):
        for name, fn in ffns.items():
            emit(time=name, **timed(fn, *args))
    for name, fn in ffns.items():
        d = tempfile.mkdtemp()
        jax.block_until_ready(fn(*args))
        jax.profiler.start_trace(d)
        for _ in range(3):
            out = fn(*args)
        jax.block_until_ready(out)
        jax.profiler.stop_trace()
        path = glob.glob(f"{d}/**/*.xplane.pb", recursive=True)[0]
        prof = jax.profiler.ProfileData.from_file(path)
        kernels = collections.Counter()
        spans = []
        for plane in prof.planes:
            if plane.name.startswith("/device:GPU:0"):
                for line in plane.lines:
                    for ev in line.events:
                        kernels[f"{line.name}: {ev.name}"] += ev.duration_ns / 3e3
                        if line.name.startswith("Stream"):
                            spans.append((ev.start_ns, ev.start_ns + ev.duration_ns, ev.name))
        spans.sort()
        gaps = sorted(((b[0] - a[1]) / 1e3, a[2][:40], b[2][:40]) for a, b in zip(spans, spans[1:]))[::-1]
        emit(gaps=name, span_us=round((spans[-1][1] - spans[0][0]) / 3e3, 1), busy_us=round(
            sum(e - s for s, e, _ in spans) / 3e3, 1), largest=[(round(g, 1), a, b) for g, a, b in gaps[:12]])
        emit(profile=name,
             kernels={k[:110]: round(v, 1) for k, v in kernels.most_common(40)})
        sys.stdout.flush()
