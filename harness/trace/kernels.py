"""Kernel classification (patterns as data) and GEMM kernel-name decoding.

Classification
--------------
`PATTERNS` is an ordered tuple of ``(Category, regex)`` pairs; the first regex that
matches a kernel's name wins (searched case-insensitively in the demangled name, which
holds the template arguments: a PyTorch ``vectorized_elementwise_kernel`` only says
*which* functor it runs there).  Order matters: ``triton_softmax_*`` must be softmax
before ``fusion`` makes it elementwise, ``gemm_fusion_*`` GEMM before elementwise,
``input_reduce_fusion`` reduction before elementwise.

Inductor (``torch.compile``) names its Triton kernels
``triton_<kind>_fused_<ops>_<n>``: ``<kind>`` is ``poi`` (pointwise), ``red`` or ``per``
(reduction, persistent reduction), ``tem`` (a template: GEMM) or ``for`` (foreach), and
``<ops>`` are the ATen ops fused into it, sorted and joined by ``_``
(``triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_3``).  `INDUCTOR_PATTERNS` reads the
kind, refined by the ops where eager PyTorch runs a kernel of its own: ``softmax`` in the
ops (also ``_log_softmax`` fused with ``nll_loss``: the loss's eager kernel is a softmax
too) or ``amax`` + ``exp`` + ``sum``; a reduction with ``rsqrt``, or ``pow`` with ``mean``
or ``sum`` (RMSNorm forward and backward); a pointwise kernel of copies, views and casts
only (memory, as eager's copy kernels); ``_foreach_`` ops (the optimizer).  The GEMMs
Inductor leaves to cuBLAS keep their cuBLAS names.

Three rules are range-aware (`PHASE_RULES`); inside ``attn_softmax`` (``--annotate-attention``)
elementwise and reduction kernels are the softmax (JAX's is an ``input_*reduce_fusion``,
torch's a ``softmax_warp_forward``), and reports say the category came from the range.
The other: XLA fuses the optimizer update into fusions
named after HLO ops (``loop_multiply_fusion``, ``input_reduce_fusion``...), and our
PyTorch AdamW's per-parameter loop (``foreach=False``) runs plain elementwise kernels; by
name both would be elementwise or reduction (its foreach update runs
``multi_tensor_apply_kernel``, the optimizer by name).  Inside the ``optimizer`` range they are the optimizer, so the
two frameworks' category shares compare like for like. The third: FSDP2 copies parameters
into each all-gather's buffer with the same foreach kernel; inside its ``FSDP::all_gather``
ranges that kernel (and the elementwise copies out) are memory, not the optimizer.

GEMM names and the products of a linear layer
---------------------------------------------
cuBLAS is column-major, PyTorch and XLA row-major.  For ``Y = X W^T`` with the weight
stored ``[out, in]`` (``nn.Linear``), the row-major product is computed as the
column-major ``Y^T = W X^T``, so the forward GEMM reads the weight transposed: ``tn``.
Backward ``dX = dY W`` needs no transpose: ``nn``.  ``dW = dY^T X`` transposes the second
operand: ``nt``.  So a training step shows ``tn`` kernels in forward and ``nn``/``nt``
kernels in backward; a framework that stores weights ``[in, out]`` (Flax ``Dense``:
``Y = X W``) shows ``nn`` forward, ``nt``/``tn`` in backward.  XLA may also pick a layout
that changes which operand is transposed, so the pattern is evidence, not proof.

Name layouts decoded by `decode_gemm` (fields a name lacks stay ``None``):

- cuBLAS xmma: ``sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_...``:
  arch, ``<A><B>_<C><accumulate>_<scale>`` types, transpose, tile.
- cuBLAS legacy: ``ampere_sgemm_128x64_tn``, ``sm80_xmma_gemm_f32f32_tf32f32_f32_nn_...``.
- CUTLASS: ``cutlass_80_tensorop_s1688gemm_128x128_16x5_tt_align4`` (``s1688`` = TF32
  tensor-core math; ``h16816`` f16; an input type beside the shape is the math:
  ``bf16_s1688gemm_bf16`` and ``bf16_s16816gemm`` are bf16), ``cutlass3x_sm90_...``.
- cuBLASLt nvjet (Hopper): ``nvjet_[smXX_]tst_128x64_64x8_1x1_v_bz_coopA_TNT``: three
  type letters ``<inputs><accumulate><output>`` (``h`` f16, ``t`` bf16, ``s`` f32),
  CTA tile ``MxN``, and ``TN?``-style transposes (the first two letters).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum


class Category(str, Enum):
    """Kernel categories, in the order reports list them."""

    GEMM = "gemm"
    ATTENTION = "fused_attention"
    SOFTMAX = "softmax"
    NORM = "normalization"
    CONVOLUTION = "convolution"
    POOLING = "pooling"
    EMBEDDING = "embedding"
    QUANTIZATION = "quantization"
    ELEMENTWISE = "elementwise"
    REDUCTION = "reduction"
    OPTIMIZER = "optimizer"
    MEMORY = "copy_memset_transpose"
    COMMUNICATION = "communication"
    AUTOTUNING = "autotuning"
    GRAPH = "cuda_graph"  # a whole CUDA graph traced as one record: its kernels are unknown
    OTHER = "other"


# One colour per category in every plot and in the timeline, whatever categories each shows.
CATEGORY_COLORS = dict(zip(Category, ("#1f77b4", "#d62728", "#9467bd", "#8c564b", "#637939", "#843c39",
                                      "#e7ba52", "#ce6dbd", "#2ca02c", "#17becf", "#ff7f0e", "#e377c2",
                                      "#bcbd22", "#c7c7c7", "#393b79", "#7f7f7f"), strict=True))


# XLA's compile-time autotuner: redzone checks around candidate buffers, the timer's
# delay kernel, buffer fills (RepeatBuffer) and the comparators that check candidates
# against a reference.
_AUTOTUNING = (r"RedzoneAllocatorKernel|redzone_checker|DelayKernel|RepeatBufferKernel|xla_\w*comparison"
               r"|BufferComparator")

# NCCL's kernels (ncclDevKernel_*, ncclKernel_*), XLA's and torch's own collective kernels
# and thunks (all-reduce, reduce-scatter, all-gather, all-to-all, collective-permute), gloo
# on CPU. "all" must not end a word ("small_reduce"), nor "reduce" be a fusion's kind.
_COLLECTIVES = (r"nccl|gloo|(?:^|[^a-z])all[-_]?(?:reduce|gather|to[-_]?all)|reduce[-_]?scatter"
                r"|collective[-_]?permute|(?:one|two)[-_]?shot|c10d::")

# cuDNN's and CUTLASS's convolutions: named conv*, the data and weight gradients
# (dgrad, wgrad), implicit-GEMM and Winograd kernels, and cuDNN's own scudnn kernels.
# "conv" must not start "convert" or "conversion".
_CONVOLUTION = r"conv(?!er)|dgrad|wgrad|fprop_implicit|implicit_gemm|implicit_convolve|winograd|scudnn"

# XLA's CPU thunks that multiply matrices: a plain `dot` (Eigen), and the YNNPACK (older:
# XNNPACK) fusions XLA's CPU backend hands its dots to, named `ynn_fusion[.N]`. Those fusions
# take a few reductions too (RMSNorm's sums: 6% of the `ynn_fusion` time of `tiny`'s fused
# step, by the optimized HLO), which the name cannot tell apart; they count with the GEMMs.
_XLA_CPU_GEMM = r"^(?:wrapped_)?dot(?:_general)?(?:\.\d+)?$|^[xy]nn_fusion(?:\.\d+)?$"

# ATen ops that only move, view or cast data (Inductor's names for them).
_COPY_OPS = (r"_to_copy|_unsafe_view|view|clone|t|transpose|permute|expand|slice|select|unbind|unsqueeze|squeeze"
             r"|cat|stack|copy_?")

# Inductor's Triton kernels, after the name-says-it-all patterns above them in
# `PATTERNS` (attention, softmax, layer norm); `(?=\w*?_op_)` asks for op `op` in the name.
INDUCTOR_PATTERNS: tuple[tuple[Category, str], ...] = (
    (Category.OPTIMIZER, r"\btriton_for_|\btriton_[a-z]+_fused\w*?__foreach_"),
    (Category.SOFTMAX, r"\btriton_(?:red|per)_(?=\w*?_amax_)(?=\w*?_exp_)(?=\w*?_sum_)"),
    (Category.NORM, r"\btriton_(?:red|per)_(?:(?=\w*?_rsqrt_)|(?=\w*?_pow_)(?=\w*?_(?:mean|sum)_))"),
    (Category.MEMORY, rf"\btriton_poi_fused(?:_(?:{_COPY_OPS}))+_\d+$"),
    (Category.GEMM, r"\btriton_tem_"),
    (Category.REDUCTION, r"\btriton_(?:red|per)_"),
    (Category.ELEMENTWISE, r"\btriton_poi_"),
)

PATTERNS: tuple[tuple[Category, str], ...] = (
    (Category.AUTOTUNING, _AUTOTUNING),
    (Category.GRAPH, r"^\[CUDA graph"),
    (Category.COMMUNICATION, _COLLECTIVES),
    (Category.ATTENTION, r"flash|fmha|sdpa|attention|mha_"),
    (Category.SOFTMAX, r"softmax"),
    (Category.NORM, r"rms_?norm|layer_?norm|RowwiseMoments|group_?norm|batch_?norm|instance_?norm|\bbn_[fb]w_"),
    *INDUCTOR_PATTERNS,  # before the op names below: Inductor names its kernels after every fused op
    (Category.CONVOLUTION, _CONVOLUTION),
    (Category.POOLING, r"pool(?:ing|_?[123]d)|(?:max|avg|average)_?pool"),
    (Category.EMBEDDING, r"(?<![a-z])embedding|bounds_check_indices|linearize_index|bucketize_sparse_features"),
    (Category.MEMORY, r"(?<![a-z])permute_\w*kernel"),
    (Category.GEMM, r"(?<!fb)gemm|nvjet|cutlass|xmma|Kernel2\b|cublas|matmul|\bdot_|gemv|^Cijk_"),  # Cijk_: AMD Tensile
    (Category.GEMM, _XLA_CPU_GEMM),  # before `fusion` makes a YNNPACK fusion elementwise
    (Category.QUANTIZATION, r"quantiz|(?<![a-z])h?fp8|float8"),
    (Category.OPTIMIZER, r"multi_tensor_apply|fused_adam|adam|_foreach_"),
    (Category.MEMORY, r"memcpy|memset|transpose|copy|\bcat\w*Batched|fill_kernel|triu_tril"),
    (Category.REDUCTION, r"reduce|reduction|\bargmax|\bargmin|scan_kernel|cumsum"),
    (Category.ELEMENTWISE, r"elementwise|fusion|\bwrapped_|silu|gelu|rotary"),
    # CPU fallback (no GPU traced): torch.profiler's aten ops stand in for kernels
    (Category.GEMM, r"^aten::(?:mm|bmm|addmm|baddbmm|matmul|linear)$"),
    (Category.MEMORY, r"^aten::(?:fill_|zero_|clone|cat|stack|tril|triu|_to_copy|index\w*|embedding\w*)$"),
    (Category.REDUCTION, r"^aten::(?:sum|mean|amax|max|min|norm|logsumexp|nll_loss\w*)$"),
    (Category.ELEMENTWISE, r"^aten::"),
)

# (range name, categories by name, category): inside that range, kernels whose name
# says one of those categories get the last one instead. A range named "NAME (...)" (how
# FSDP2 names a range per module) is NAME's too (`rule_matches`).
PHASE_RULES: tuple[tuple[str, tuple[Category, ...], Category], ...] = (
    ("optimizer", (Category.ELEMENTWISE, Category.REDUCTION), Category.OPTIMIZER),
    # JAX's naive-attention softmax is an `input_*reduce_fusion` (by name a reduction)
    ("attn_softmax", (Category.ELEMENTWISE, Category.REDUCTION), Category.SOFTMAX),
    # FSDP2 copies the parameters into the all-gather's buffer with a foreach copy
    # (`multi_tensor_apply_kernel`, by name the optimizer's) and out of it with split copies
    ("FSDP::all_gather", (Category.OPTIMIZER, Category.ELEMENTWISE), Category.MEMORY),
)


def rule_matches(rule_range: str, range_name: str) -> bool:
    """Whether a range named `range_name` is the `PHASE_RULES` range `rule_range`."""
    return range_name == rule_range or range_name.startswith(rule_range + " (")

_COMPILED = tuple((cat, re.compile(rx, re.IGNORECASE)) for cat, rx in PATTERNS)
_ANONYMOUS = "(anonymous namespace)"
NAME_WIDTH = 90


def own_name(name: str) -> str:
    """The kernel's name and template arguments without its parameter list: what the kernel
    is, not the types it takes (``split_embedding_*(..., fbgemm_gpu::...)`` is no GEMM)."""
    depth = 0
    for i, ch in enumerate(name):
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0 and i and not name.startswith(_ANONYMOUS, i):
            return name[:i]
    return name


def short_name(name: str, width: int = NAME_WIDTH) -> str:
    """A kernel name fit for a table: no ``void``, no argument list, at most `width` chars.
    Bracketed placeholders (``[CUDA graph: ...]``, ``[CUDA memcpy]``) stay whole;
    ``(anonymous namespace)::`` goes, so the name keeps what tells it apart."""
    if name.startswith("["):
        return name
    name = own_name(name.removeprefix("void ")).replace("(anonymous namespace)::", "").strip()
    name = name.replace("|", "\\|")
    return name if len(name) <= width else name[: width - 1] + "…"


_SPELLINGS = (  # how nsys's demangler and Kineto's (the C++ ABI's) write the same name, as one
    (re.compile(r"\(anonymous namespace\)"), "<unnamed>"),
    (re.compile(r"\(bool\)0"), "false"), (re.compile(r"\(bool\)1"), "true"),
    (re.compile(r"\((?:unsigned )?(?:int|long|short|char|long long)\)(-?\d+)"), r"\1"),
    (re.compile(r"\b(\d+)(?:ull|ul|ll|u|l)\b"), r"\1"),
    (re.compile(r"\[lambda\(([^()]*)\) \(instance (\d+)\)\]"), r"{lambda(\1)#\2}"),
    (re.compile(r"\s+(?=[*&>(])"), ""),
    (re.compile(r"\bconst ([\w:]+(?:<[^<>]*>)?)([&*])"), r"\1 const\2"),
    (re.compile(r"(?<=[<,] )void |(?<=<)void "), ""),
)


def canonical_name(name: str) -> str:
    """One spelling of a kernel name whichever tool recorded it: the own name (no parameter
    list), anonymous namespaces, integer casts and suffixes, lambdas and spaces written
    alike; Kineto's "Memcpy DtoD (...)"/"Memset (...)" as nsys's "[CUDA memcpy]"/"[CUDA memset]"."""
    if name.startswith(("Memcpy", "Memset")):
        return f"[CUDA {name[:6].lower()}]"
    out = own_name(name)
    for rx, to in _SPELLINGS:
        out = rx.sub(to, out)
    return out


_NUMBERED = re.compile(r"^([A-Za-z][A-Za-z0-9_]*?)_{1,2}\d+$")


def across_programs(a: set[str], b: set[str]) -> dict[str, str]:
    """Each kernel name of two programs -> the name it is compared under. XLA numbers the
    kernels it generates per program (`loop_add_fusion_35`, `add_rms_norm_bwd__1` beside
    `add_rms_norm_bwd`), so one name in two programs need not be one kernel: where both
    programs have names of a stem and those names differ, all of them are compared as one row,
    `stem_*`; other names stand for themselves."""
    stems = {m[1] for name in a | b if (m := _NUMBERED.match(name))}
    out = {name: name for name in a | b}
    for stem in stems:
        in_a, in_b = ({n for n in names if n == stem or ((m := _NUMBERED.match(n)) and m[1] == stem)}
                      for names in (a, b))
        if in_a and in_b and in_a != in_b:
            out.update(dict.fromkeys(in_a | in_b, f"{stem}_*"))
    return out


def classify(name: str, ranges: tuple[str, ...] = ()) -> Category:
    """Category of kernel `name`; `ranges` are the names of the ranges containing it."""
    own = own_name(name)
    category = next((cat for cat, rx in _COMPILED if rx.search(own)), Category.OTHER)
    for range_name, by_name, cat in PHASE_RULES:
        if category in by_name and any(rule_matches(range_name, r) for r in ranges):
            return cat
    return category


def is_autotuning(name: str) -> bool:
    """True for XLA compile-time autotuner kernels (not part of the computation)."""
    return classify(name) is Category.AUTOTUNING


@dataclass(frozen=True)
class GemmInfo:
    """What a GEMM kernel's name says about it (``None``: the name does not say)."""

    arch: str | None  # "sm80", "sm90"
    types: str | None  # as written in the name, e.g. "bf16bf16_bf16f32_f32", "tst"
    math: str | None  # the tensor-core input type: "bf16", "f16", "tf32", "f32"
    transpose: str | None  # "tn", "nn", "nt", "tt" (cuBLAS column-major view)
    tile: str | None  # CTA tile, e.g. "128x128x32" or "128x64"


_ARCH_NAMES = {"volta": "sm70", "turing": "sm75", "ampere": "sm80", "hopper": "sm90"}
_NVJET_LETTERS = {"h": "f16", "t": "bf16", "s": "f32", "e": "fp8"}
_TYPE_TOKEN = r"(?:bf16|f16|f32|tf32|f64|i8|e4m3|e5m2|s8)"


def _math_of(types: str) -> str | None:
    for t in ("tf32", "bf16", "f16", "e4m3", "e5m2", "i8", "f64", "f32"):
        if t in types:
            return t
    return None


def decode_gemm(name: str) -> GemmInfo | None:
    """Decode a GEMM kernel name; ``None`` when the name is not a GEMM's."""
    if classify(name) is not Category.GEMM:
        return None
    arch = types = math = transpose = tile = None
    if m := re.search(r"\bsm_?(\d{2,3})[a-z]?_|cutlass(?:3x)?_(?:sm)?(\d{2,3})_", name):
        arch = f"sm{m.group(1) or m.group(2)}"
    elif m := re.search(r"\b(volta|turing|ampere|hopper)_", name):
        arch = _ARCH_NAMES[m.group(1)]
    if m := re.search(r"nvjet_(?:sm\d+_)?([a-z])([a-z])([a-z])_(\d+x\d+)_.*?_([TN])([TN])[TN]?\b", name):
        arch = arch or "sm90"
        types = "".join(m.group(i) for i in (1, 2, 3))
        math = _NVJET_LETTERS.get(m.group(1))
        tile = m.group(4)
        transpose = (m.group(5) + m.group(6)).lower()
        return GemmInfo(arch, types, math, transpose, tile)
    if m := re.search(rf"gemm_({_TYPE_TOKEN}+_{_TYPE_TOKEN}+(?:_{_TYPE_TOKEN}+)?)_", name):
        types = m.group(1)
        # "<A><B>_<C><compute>": the compute token (second group) is the math, e.g. tf32
        math = _math_of(types.split("_")[1]) or _math_of(types)
    elif m := re.search(r"(?:^|_)(?:(bf16|f16)_)?([shd])(\d{3,5})gemm(?:_(?:\w*?_)?(bf16|f16)(?=_))?", name):
        # CUTLASS: [<input type>_]<accumulator letter><mma shape>gemm[_<input type>]; the input
        # type, where named, is the math (bf16_s1688gemm_bf16: bf16 in, f32 accumulate);
        # s1688/s1684 without one is TF32
        types = m.group(0).strip("_")
        tf32 = m.group(2) == "s" and m.group(3) in ("1688", "1684")
        math = m.group(1) or m.group(4) or ("tf32" if tf32 else {"h": "f16", "d": "f64"}.get(m.group(2)))
    elif re.search(r"_(sgemm|hgemm|dgemm)", name):
        types = re.search(r"_(sgemm|hgemm|dgemm)", name).group(1)
        math = {"sgemm": "f32", "hgemm": "f16", "dgemm": "f64"}[types]
    if m := re.search(r"_(tn|nn|nt|tt)(?:_|$|\b)", name):
        transpose = m.group(1)
    if m := re.search(r"tilesize(\d+x\d+x\d+)", name):
        tile = m.group(1)
    elif m := re.search(r"_(\d+x\d+)(?:_(\d+)x\d+)?_", name):
        tile = m.group(1) + (f"x{m.group(2)}" if m.group(2) else "")
    return GemmInfo(arch, types, math, transpose, tile)
