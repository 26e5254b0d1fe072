"""What the attention tools measure: implementations, passes, dtypes and shape sets, in one place.

FLOP convention: forward = 4*B*H*S^2*D (QK^T and PV), halved when causal; backward =
2.5x forward (five matmuls instead of two); forward+backward = 3.5x forward. D is the
true head_dim, not the padded one.
"""

from __future__ import annotations

from collections.abc import Sequence

PASSES = ("fwd", "bwd", "fwd_bwd")
# The passes with kernels of their own: the target check and the block-size search take these.
KERNEL_PASSES = ("fwd", "bwd")
PASS_FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}
SDPA_IMPLS = ("torch_sdpa_flash", "torch_sdpa_efficient", "torch_sdpa_cudnn")
IMPLS = ("pallas", "pallas_mosaic", "jax_pallas_mha", "jax_cudnn", "xla_naive", *SDPA_IMPLS, "torch_naive")
TORCH_IMPLS = (*SDPA_IMPLS, "torch_naive")  # built with torch; the others with JAX
GPU_ONLY = ("pallas_mosaic", "jax_pallas_mha", "jax_cudnn", *SDPA_IMPLS)
# References for the throughput targets: every SDPA backend and cuDNN via JAX.
BEST_REF_IMPLS = (*SDPA_IMPLS, "jax_cudnn")
SHAPE_SETS = ("grid", "fa3", "leaderboard")
FA3_TOKENS = 16384
FA3_HIDDEN = 2048
FA3_SEQS = (512, 1024, 2048, 4096, 8192, 16384)
# Command-line dtype names and the array dtype each stands for.
DTYPES = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}
DEFAULT_SEQS = tuple(2**p for p in range(7, 15))
# Non-causal cells are only run from this length up when --causal both.
NONCAUSAL_MIN_SEQ = 1024
# Untimed calls of a pass before each of its timed repeats. An H100 at its
# power limit changed its SM clock in steps about 100 ms apart and had
# settled 200 ms after switching from one attention implementation to another.
LEAD_IN_MS = 200.0


def resolve_shapes(shapes: str, seq: list[int] | None, head_dim: list[int] | None) -> tuple[list[int], list[int]]:
    """The sequence lengths and head dims of a shape set, defaults filled in; a ValueError
    names the values an `fa3` set cannot take."""
    if shapes == "fa3":
        seq = seq or [s for s in FA3_SEQS if s >= 1024]
        head_dim = head_dim or [64, 128]
        bad = [d for d in head_dim if FA3_HIDDEN % d] + [s for s in seq if FA3_TOKENS % s]
        if bad:
            raise ValueError(f"--shapes fa3 needs head_dim dividing {FA3_HIDDEN} and seq dividing {FA3_TOKENS}; "
                             f"got {bad}")
        return seq, head_dim
    return seq or list(DEFAULT_SEQS), head_dim or [64, 80, 128]


def cells(shapes: str, seqs: Sequence[int], head_dims: Sequence[int], dtypes: Sequence[str], causal: str,
          batch: int, heads: int) -> list[dict]:
    """The cells of a shape set (`--shapes`) in measuring order; `causal` true, false or
    both; `batch` and `heads` for the grid (the other sets fix theirs)."""
    if shapes == "leaderboard":
        return [dict(batch=16, heads=1, seq=16384, head_dim=64, dtype=DTYPES[dtype], causal=True)
                for dtype in dtypes]
    out = []
    for dtype in dtypes:
        for head_dim in head_dims:
            for seq in seqs:
                flags = {"true": [True], "false": [False], "both": [True, False]}[causal]
                for is_causal in flags:
                    if causal == "both" and not is_causal and seq < NONCAUSAL_MIN_SEQ:
                        continue
                    cell_batch, cell_heads = ((FA3_TOKENS // seq, FA3_HIDDEN // head_dim) if shapes == "fa3"
                                              else (batch, heads))
                    out.append(dict(batch=cell_batch, heads=cell_heads, seq=seq, head_dim=head_dim,
                                    dtype=DTYPES[dtype], causal=is_causal))
    return out


def fwd_flops(cell: dict) -> float:
    flops = 4.0 * cell["batch"] * cell["heads"] * cell["seq"] ** 2 * cell["head_dim"]
    return flops / 2 if cell["causal"] else flops


def cell_key(row: dict) -> tuple:
    """A row's cell: (batch, heads, seq, head_dim, dtype, causal)."""
    return tuple(row[k] for k in ("batch", "heads", "seq", "head_dim", "dtype", "causal"))
