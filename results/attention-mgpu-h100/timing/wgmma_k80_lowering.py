"""Can the backward take 80-row query steps (FA3's head_dim 128 non-causal
tile)? Lowers, on the CPU for the CUDA platform, the two products that meet
an 80-row query block: S^T = K Q^T (N = 80) and dV += P^T dO (P^T from
registers, K = 80 query rows), with the query-side tile at each swizzle.

usage: PYTHONPATH=. python results/attention-mgpu-h100/timing/wgmma_k80_lowering.py"""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

BQ, D = 80, 128


def swizzled(swizzle: int):
    return plgpu.TilingTransform((8, swizzle // 2)), plgpu.SwizzleTransform(swizzle)


def body(q_ref, k_ref, o_ref, q_smem, k_smem, bar):
    start = 960 + jax.lax.axis_index("x") * 0  # dynamic: the block reaches past row 1000 (TMA clips it)
    plgpu.copy_gmem_to_smem(q_ref.at[pl.ds(start, BQ)], q_smem, bar)
    plgpu.copy_gmem_to_smem(k_ref, k_smem, bar)
    plgpu.barrier_wait(bar)

    def scores(ref):
        plgpu.wgmma(ref, k_smem, q_smem.T)  # S^T [64 keys, 80 queries]
        return ref[...]

    p_t = pl.run_scoped(scores, plgpu.ACC((64, BQ), jnp.float32)).astype(jnp.bfloat16)
    zeros = plgpu.layout_cast(jnp.zeros((64, D), jnp.float32), plgpu.Layout.WGMMA)
    dv = pl.run_state(lambda r: plgpu.wgmma(r[0], p_t, q_smem))((plgpu.ACC.init(zeros),))[0]  # K = 80
    k_smem[...] = dv.astype(jnp.bfloat16)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(k_smem, o_ref)
    plgpu.wait_smem_to_gmem(0)


q = jax.ShapeDtypeStruct((1000, D), jnp.bfloat16)
k = jax.ShapeDtypeStruct((64, D), jnp.bfloat16)
print("jax", jax.__version__)
for q_swizzle, k_swizzle in ((128, 128), (32, 128), (32, 32)):
    scratch = [plgpu.SMEM((BQ, D), jnp.bfloat16, transforms=swizzled(q_swizzle)),
               plgpu.SMEM((64, D), jnp.bfloat16, transforms=swizzled(k_swizzle)), plgpu.Barrier(num_arrivals=2)]
    f = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((64, D), jnp.bfloat16), scratch_types=scratch, grid=(1,),
                     grid_names=("x",), num_threads=1, thread_name="wg")
    try:
        jax.jit(f).trace(q, k).lower(lowering_platforms=("cuda",))
        result = "lowers"
    except Exception as exc:  # noqa: BLE001 - the point is to record what Mosaic GPU rejects
        result = f"{type(exc).__name__}: {exc}"
    print(f"query tile swizzle {q_swizzle} B, key tile {k_swizzle} B: {result}")
