"""Correctness of the Pallas FlashAttention-2 kernels against the jnp reference.

The sweep runs twice: in Pallas interpret mode on CPU (always), and compiled on
GPU (skipped when the first JAX device is not a GPU).
"""

from __future__ import annotations

import dataclasses
import json
import math
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import on_two_host_devices

from pallas_kernels import BlockSizes, flash_attention, flash_attention_with_lse, mha_reference, reference_lse

# Relative error ||got - want|| / ||want|| allowed, per (dtype, mode). The
# reference is float32. Interpret mode computes in exact float32 on CPU; on
# GPU float32 inputs go through TF32 tensor cores (10-bit mantissa), and
# bfloat16/float16 round P and dS to the input dtype before each product.
TOLERANCES = {
    ("float32", "interpret"): 1e-5,
    ("float32", "gpu"): 3e-3,
    ("bfloat16", "interpret"): 2e-2,
    ("bfloat16", "gpu"): 2e-2,
    ("float16", "interpret"): 3e-3,
    ("float16", "gpu"): 3e-3,
}

# Small tiles so short sequences still cross several blocks, the diagonal and a
# ragged tail; `None` means the tuned defaults.
SMALL_BLOCKS = BlockSizes(block_q=32, block_k=16, block_q_dkv=16, block_k_dkv=32, block_q_dq=32, block_k_dq=16)


@dataclasses.dataclass(frozen=True)
class Case:
    batch: int
    seq: int
    heads: int
    head_dim: int
    causal: bool
    dtype: str
    blocks: BlockSizes | None = SMALL_BLOCKS

    def __str__(self) -> str:
        blocks = "default" if self.blocks is None else "small"
        causal = "causal" if self.causal else "full"
        return f"b{self.batch}-s{self.seq}-h{self.heads}-d{self.head_dim}-{causal}-{self.dtype}-{blocks}blocks"


# Curated rather than a full product: every sequence length (1, 17, 128, 200,
# 513), head_dim (64, 80, 128), dtype and causal flag appears, lengths that are
# and are not multiples of the tiles, and both tile configurations.
CASES = [
    Case(1, 1, 1, 64, True, "bfloat16"),
    Case(2, 17, 3, 64, True, "float32"),
    Case(1, 17, 1, 80, False, "bfloat16"),
    Case(1, 128, 2, 64, True, "bfloat16"),
    Case(2, 128, 1, 128, False, "float32"),
    Case(1, 200, 2, 80, True, "float32"),
    Case(2, 200, 1, 128, True, "bfloat16"),
    Case(1, 200, 1, 64, False, "float16"),
    Case(1, 513, 1, 64, True, "bfloat16", None),
    Case(1, 513, 2, 80, False, "float32", None),
    Case(1, 256, 1, 128, True, "float32", None),
]
# (seq 1 runs in bfloat16: its dQ and dK are exactly zero, and on GPU float32
# the TF32 rounding of dP against the exact float32 D leaves noise of ~0.5%.)


def rel_err(got: jax.Array, want: jax.Array) -> float:
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    # Floor the denominator at an RMS of 0.05 (below every non-zero gradient
    # RMS in the sweep) so an all-zero reference, e.g. dQ and dK when each row
    # attends to a single key, is compared on an absolute scale instead.
    floor = 0.05 * math.sqrt(want.size)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), floor))


def make_inputs(case: Case) -> tuple[jax.Array, ...]:
    """Fresh q, k, v, dO per case, seeded by the case's description."""
    key = jax.random.key(zlib.crc32(str(case).encode()))
    shape = (case.batch, case.seq, case.heads, case.head_dim)
    return tuple(jax.random.normal(k, shape, jnp.float32).astype(case.dtype) for k in jax.random.split(key, 4))


def errors(case: Case, interpret: bool, sm_scale: float | None = None, backend: str | None = None) -> dict[str, float]:
    """Relative errors of o, lse, dq, dk, dv for one case. `sm_scale` is
    passed to the kernel only, so a wrong value must show up as an error.
    `backend` None lets the kernel choose (on Hopper, bf16/fp16 go to the
    Mosaic kernels)."""
    q, k, v, do = make_inputs(case)
    kwargs = dict(causal=case.causal, block_sizes=case.blocks, interpret=interpret, backend=backend)
    o, lse = jax.jit(lambda q, k, v: flash_attention_with_lse(q, k, v, sm_scale=sm_scale, **kwargs))(q, k, v)
    grads = jax.jit(
        lambda q, k, v, do: jax.vjp(lambda *x: flash_attention(*x, sm_scale=sm_scale, **kwargs), q, k, v)[1](do)
    )(q, k, v, do)

    def reference(q, k, v):
        return mha_reference(q, k, v, causal=case.causal)

    @jax.jit  # one program: op by op, each of the reference's ops would compile on its own for every shape
    def references(q, k, v, do):
        want_o, ref_vjp = jax.vjp(reference, q, k, v)
        return want_o, ref_vjp(do.astype(jnp.float32)), reference_lse(q, k, causal=case.causal)

    want_o, want_grads, want_lse = references(q, k, v, do)
    assert o.dtype == q.dtype and o.shape == q.shape
    assert all(g.dtype == q.dtype and g.shape == q.shape for g in grads)
    got = {"o": o, "lse": lse, "dq": grads[0], "dk": grads[1], "dv": grads[2]}
    want = {"o": want_o, "lse": want_lse, "dq": want_grads[0],
            "dk": want_grads[1], "dv": want_grads[2]}
    return {name: rel_err(got[name], want[name]) for name in got}


def check(case: Case, mode: str, backend: str | None = None) -> None:
    tol = TOLERANCES[(case.dtype, mode)]
    # Interpret mode is pinned to the CPU: on a GPU machine the interpreter would
    # otherwise run on the GPU, where float32 dots default to TF32.
    device = jax.devices("cpu")[0] if mode == "interpret" else jax.devices()[0]
    with jax.default_device(device):
        errs = errors(case, interpret=mode == "interpret", backend=backend)
    assert all(math.isfinite(e) for e in errs.values()), errs
    bad = {name: e for name, e in errs.items() if e > tol}
    assert not bad, f"{case} ({mode}): errors {bad} exceed {tol}"


def on_gpu() -> bool:
    return jax.devices()[0].platform == "gpu"


@pytest.mark.parametrize("case", CASES, ids=str)
def test_interpret_matches_reference(case: Case) -> None:
    check(case, "interpret")


@pytest.mark.skipif(not on_gpu(), reason="needs a GPU")
@pytest.mark.parametrize("case", CASES, ids=str)
def test_gpu_matches_reference(case: Case) -> None:
    # The portable kernels, also on Hopper (where the default would pick the
    # Mosaic kernels for bf16/fp16; those have their own test file).
    check(case, "gpu", backend="triton")


def test_each_kernel_is_lowered_once_however_many_calls() -> None:
    """Three layers' attention, forward and backward: each kernel function is
    emitted once and called three times (lowering per call site made the
    36-layer model's compile minutes longer)."""
    x = jnp.ones((1, 16, 1, 16), jnp.float32)

    def loss(q, k, v):
        for _ in range(3):
            q = flash_attention(q, k, v, causal=True, interpret=True)
        return q.sum()

    text = jax.jit(jax.grad(loss)).lower(x, x, x).as_text()
    for fn in ("triton_forward", "triton_backward"):
        assert text.count(f"func.func private @{fn}(") == 1, fn
        assert text.count(f"call @{fn}(") == 3, fn


_ON_MESH = r"""
import json, re, jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from pallas_kernels import flash_attention, flash_attention_with_lse
mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
q, k, v = (jax.random.normal(jax.random.key(i), (4, 128, 2, 32), jnp.float32) for i in range(3))
attend = lambda q, k, v: flash_attention(q, k, v, causal=True, backend="triton", interpret=True)
def loss(q, k, v):
    o = attend(q, k, v)
    return jnp.sum(o * o), o
def layers(q, k, v):
    for _ in range(3):
        q = attend(q, k, v)
    return q.sum()
step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
(l1, o1), g1 = step(q, k, v)
split = [jax.device_put(x, NamedSharding(mesh, P("data"))) for x in (q, k, v)]
with jax.set_mesh(mesh):
    (l2, o2), g2 = step(*split)
    gathers = len(re.findall(r"all-gather\(", step.lower(*split).compile().as_text()))
    lse = jax.jit(lambda q, k, v: flash_attention_with_lse(q, k, v, causal=True, backend="triton",
                                                           interpret=True)[1])(*split)
    text = jax.jit(jax.grad(layers)).lower(*split).as_text()
print(json.dumps({"gathers": gathers, "specs": [str(tuple(x.sharding.spec)) for x in (o2, *g2, lse)],
                  "o": float(jnp.max(jnp.abs(o1 - o2))), "loss": [float(l1), float(l2)],
                  "grads": [float(jnp.max(jnp.abs(a - b))) for a, b in zip(g1, g2)],
                  "funcs": [text.count(f"func.func private @{fn}(") for fn in ("triton_forward", "triton_backward")],
                  "calls": [text.count(f"call @{fn}(") for fn in ("triton_forward", "triton_backward")]}))
"""


def test_with_a_mesh_set_the_kernels_run_on_each_devices_batch() -> None:
    """q, k, v split by batch over two host devices, with the mesh set: each device runs the
    kernels on its own sequences and nothing is gathered (XLA cannot split a kernel call by
    itself: it would gather q, k and v and compute every device's attention on each), the
    outputs and gradients stay split, and they are the one-device numbers exactly (each row is
    computed alike wherever it runs; the loss is summed in another order). Three layers still
    lower each kernel once."""
    proc = on_two_host_devices(_ON_MESH)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["gathers"] == 0
    assert got["specs"] == ["('data',)"] * 5  # o, dq, dk, dv, then lse
    assert got["o"] == 0.0 and max(got["grads"]) == 0.0
    np.testing.assert_allclose(got["loss"][1], got["loss"][0], rtol=4 * 128 * 2 * 32 * 2 ** -24)
    assert got["funcs"] == [1, 1] and got["calls"] == [3, 3]


_IN_SHARD_MAP = r"""
import json, jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, PartitionSpec as P
from pallas_kernels import flash_attention
mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
q, k, v = jax.random.normal(jax.random.key(0), (3, 4, 128, 2, 64), jnp.float32)
attend = lambda q, k, v: flash_attention(q, k, v, causal=True, interpret=True)
whole = jax.jit(attend)(q, k, v)
with jax.set_mesh(mesh):
    mine = jax.jit(jax.shard_map(attend, mesh=mesh, in_specs=P("data"), out_specs=P("data"), check_vma=False))(q, k, v)
print(json.dumps({"max_abs": float(jnp.max(jnp.abs(mine - whole)))}))
"""


def test_inside_a_caller_s_shard_map_the_kernels_take_the_arrays_as_given() -> None:
    """Called inside the caller's own `shard_map` over the mesh set, the arrays are one device's
    already: the kernels run on them as given (no second split over the same axes), and each
    row is the one the unsplit call computes, exactly."""
    proc = on_two_host_devices(_IN_SHARD_MAP)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["max_abs"] == 0.0


def test_wrong_scale_is_detected() -> None:
    """The harness can fail: a 10% wrong softmax scale exceeds the tolerance."""
    case = Case(1, 64, 1, 64, True, "float32")
    scale = 1.1 / math.sqrt(case.head_dim)
    errs = errors(case, interpret=not on_gpu(), sm_scale=scale)
    mode = "gpu" if on_gpu() else "interpret"
    assert min(errs.values()) > TOLERANCES[("float32", mode)], errs


def test_explicit_default_scale_matches() -> None:
    q, k, v, _ = make_inputs(Case(1, 33, 1, 64, False, "float32"))
    a = flash_attention(q, k, v, causal=False, interpret=True)
    b = flash_attention(q, k, v, causal=False, sm_scale=1 / 8, interpret=True)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize(
    ("shapes", "kwargs", "match"),
    [
        ([(2, 16, 2, 64)] * 2 + [(2, 16, 2)], {}, "v.ndim=3"),
        ([(2, 16, 2, 64), (2, 32, 2, 64), (2, 32, 2, 64)], {}, "same shape"),
        ([(1, 16, 1, 512)] * 3, {}, "head_dim=512 must be between 1 and 256"),
        ([(1, 16, 1, 64)] * 3, {"backend": "cuda"}, "backend='cuda'.*'auto', 'triton'"),
        ([(1, 16, 1, 64)] * 3, {"sm_scale": -1.0}, "sm_scale=-1.0"),
        ([(1, 16, 1, 64)] * 3, {"block_sizes": (64, 64)}, "block_sizes"),
    ],
)
def test_bad_inputs_raise(shapes, kwargs, match) -> None:
    arrays = [jnp.zeros(s, jnp.float32) for s in shapes]
    with pytest.raises(ValueError, match=match):
        flash_attention(*arrays, interpret=True, **kwargs)


def test_bad_dtype_and_blocks_raise() -> None:
    x = jnp.zeros((1, 16, 1, 64), jnp.int32)
    with pytest.raises(ValueError, match="dtype=int32"):
        flash_attention(x, x, x, interpret=True)
    with pytest.raises(ValueError, match="block_q=48 must be a power of two"):
        BlockSizes(block_q=48)


def test_bench_cpu_smoke(tmp_path) -> None:
    """The benchmark's data and rendering path on a tiny CPU shape."""
    from harness import bench_attention

    args = bench_attention.parse_args(
        ["--device", "cpu", "--seq", "128", "--head-dim", "64", "--dtype", "fp32", "--causal", "true",
         "--impl", "pallas,xla_naive,torch_naive", "--iters", "2", "--warmup", "1", "--out", str(tmp_path)]
    )
    rows = bench_attention.run_benchmark(args)
    assert {r["impl"] for r in rows} == {"pallas", "xla_naive", "torch_naive"}
    assert all(r["status"] == "ok" for r in rows), rows
    assert all(r["fwd_ms"] > 0 and r["fwd_bwd_ms"] > 0 for r in rows)
    paths = bench_attention.write_results(rows, args)
    assert json.loads(paths["json"].read_text())["results"]
    assert paths["png"].stat().st_size > 0
    assert "pallas" in paths["md"].read_text()
    # --render rewrites the table and plot from the JSON alone, identically.
    table = paths["md"].read_text()
    paths["md"].unlink()
    paths["png"].unlink()
    assert bench_attention.main(["--render", str(paths["json"])]) == 0
    assert paths["md"].read_text() == table
    assert paths["png"].stat().st_size > 0


def test_bench_stopped_part_way_keeps_the_cells_it_finished(tmp_path, monkeypatch, capsys) -> None:
    """A sweep stopped part-way (a time limit's SIGTERM, Ctrl-C) writes the
    cells it measured completely, says so in its files, and exits 1."""
    from harness import bench_attention

    measured = []

    def row(impl, cell, ms):
        times = {f"{p}{suffix}": value for p, t in zip(bench_attention.PASSES, (ms, 2 * ms, 3 * ms))
                 for suffix, value in (("_ms", t), ("_ms_spread", [t, t]), ("_tflops", 1 / t))}
        return {"impl": impl, **cell, "status": "ok", **times}

    def measure_cell(cell, impls, args):
        if measured:  # the second cell: stopped after its first implementation
            yield row(impls[0], cell, 1.0)
            raise KeyboardInterrupt
        measured.append(cell)
        for impl, ms in zip(impls, (1.0, 2.0)):
            yield row(impl, cell, ms)

    monkeypatch.setattr(bench_attention, "measure_cell", measure_cell)
    argv = ["--device", "cpu", "--seq", "128,256", "--head-dim", "64", "--dtype", "fp32", "--causal", "true",
            "--impl", "pallas,xla_naive", "--out", str(tmp_path), "--name", "stopped"]
    assert bench_attention.main(argv) == 1
    assert "stopped; keeping the 1 cell(s) measured completely (of 2)" in capsys.readouterr().err
    data = json.loads((tmp_path / "stopped.json").read_text())
    assert data["environment"]["stopped_after_cells"] == 1
    assert [(r["impl"], r["seq"]) for r in data["results"]] == [("pallas", 128), ("xla_naive", 128)]
    assert "only the first 1 cell(s) were measured" in (tmp_path / "stopped.md").read_text()


def test_bench_render_names_the_fix(tmp_path, capsys) -> None:
    from harness import bench_attention

    assert bench_attention.main(["--render", str(tmp_path / "missing.json")]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "other.json"
    bad.write_text('{"rows": []}')
    assert bench_attention.main(["--render", str(bad)]) == 2
    assert "not a results JSON" in capsys.readouterr().err
