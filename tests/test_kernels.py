"""Classification patterns and GEMM decoding, on kernel names from real profiles."""

from __future__ import annotations

import pytest

from harness.trace import kernels
from harness.trace.kernels import Category, classify, decode_gemm, is_autotuning

# Names seen in public nsys/torch.profiler output and in NOTES of the project's GPU machine.
PUBLIC = {
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas": Category.GEMM,  # noqa: E501
    "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT": Category.GEMM,
    "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_16x5_tt_align4>(cutlass_80_tensorop_s1688gemm_128x128_16x5_tt_align4::Params)": Category.GEMM,  # noqa: E501
    "gemm_fusion_dot_3": Category.GEMM,
    "triton_softmax_2": Category.SOFTMAX,
    "loop_multiply_fusion": Category.ELEMENTWISE,
    "input_reduce_fusion": Category.REDUCTION,
    # our Pallas norm kernels as an H200 profile named them (XLA numbers repeated launches)
    "add_rms_norm_fwd": Category.NORM,
    "add_rms_norm_bwd__2": Category.NORM,
    "rms_norm_fwd": Category.NORM,
    "fmha_cutlassF_f32_aligned_64x64_rf_sm80": Category.ATTENTION,
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64_4x1x1_kernel0_0": Category.ATTENTION,
    "RedzoneAllocatorKernelImpl": Category.AUTOTUNING,
    "DelayKernel": Category.AUTOTUNING,
    "__xla_fp32_comparison": Category.AUTOTUNING,
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL": Category.COMMUNICATION,
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<4> >": Category.OPTIMIZER,  # noqa: E501
    "[CUDA memcpy]": Category.MEMORY,
    "[CUDA memset]": Category.MEMORY,
    # rocBLAS/hipBLASLt's Tensile GEMM, from HTA's MI250 trace (tests/data/hta/mi250_rocm.json.gz)
    "Cijk_Alik_Bljk_SB_Bias_AS_SAV_UserArgs_MT64x16x32_MI16x16x1_SN_LDSB0_AFC1_AFEM1_AFEM1_ASEM1_CLR1": Category.GEMM,
}


@pytest.mark.parametrize("name,category", PUBLIC.items())
def test_public_names(name: str, category: Category) -> None:
    assert classify(name) is category


def test_first_match_wins() -> None:
    # "softmax" comes before the elementwise "fusion"; "gemm" before it too
    assert classify("triton_softmax_fusion") is Category.SOFTMAX
    assert classify("gemm_fusion_dot_1") is Category.GEMM
    # autotuning comes before everything
    assert is_autotuning("RedzoneAllocatorKernelImpl")
    assert not is_autotuning("loop_add_fusion")


def test_phase_rule_makes_update_kernels_optimizer() -> None:
    assert classify("loop_multiply_fusion", ("step", "optimizer")) is Category.OPTIMIZER
    assert classify("loop_multiply_fusion", ("step", "forward")) is Category.ELEMENTWISE
    # a GEMM stays a GEMM in the optimizer range
    assert classify("gemm_fusion_dot_3", ("optimizer",)) is Category.GEMM


@pytest.mark.parametrize("name,arch,math,transpose,tile", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",  # noqa: E501
     "sm90", "bf16", "tn", "128x128x64"),
    ("sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x16_stage4_warpsize2x2x1_tensor16x8x8_kernel",
     "sm80", "tf32", "nn", "128x128x16"),
    ("ampere_sgemm_128x64_tn", "sm80", "f32", "tn", "128x64"),
    ("cutlass_80_tensorop_s1688gemm_128x128_16x5_nt_align4", "sm80", "tf32", "nt", "128x128x16"),
    ("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x5_tn_align8", "sm80", "bf16", "tn", "64x64x64"),
    # cuBLAS's sm75 fallback for bf16: the input type before the shape, not TF32 math
    ("cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_tn_align1", "sm75", "bf16", "tn", "128x128"),
    ("nvjet_tst_128x64_64x8_1x1_v_bz_coopA_TNT", "sm90", "bf16", "tn", "128x64"),
    ("nvjet_sm90_hss_64x8_64x16_1x1_h_bz_splitK_NNT", "sm90", "f16", "nn", "64x8"),
])
def test_decode_gemm(name: str, arch: str, math: str, transpose: str, tile: str) -> None:
    info = decode_gemm(name)
    assert (info.arch, info.math, info.transpose, info.tile) == (arch, math, transpose, tile)


def test_decode_gemm_rejects_non_gemm_and_keeps_unknown_fields_empty() -> None:
    assert decode_gemm("triton_softmax_2") is None
    info = decode_gemm("gemm_fusion_dot_3")
    assert info is not None and info.transpose is None and info.arch is None


# -- names from the captured harness profiles (tests/data) ---------------------------
def _names(scenario: str) -> set[str]:
    from pathlib import Path

    from harness.trace.sources.nsys import read_sqlite

    path = Path(__file__).parent / "data" / scenario / f"{scenario}.sqlite.gz"
    return set(read_sqlite(path).kernels.names)


@pytest.mark.parametrize("scenario,fragment,category", [
    ("torch_tiny_attn", "softmax_warp_forward", Category.SOFTMAX),
    ("torch_tiny_attn", "triu_tril_kernel", Category.MEMORY),
    ("torch_small_train", "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n", Category.GEMM),
    ("torch_small_train", "cutlass_80_simt_sgemm", Category.GEMM),
    ("torch_small_train", "at::native::reduce_kernel", Category.REDUCTION),
    ("torch_small_train", "splitKreduce_kernel", Category.GEMM),  # split-K GEMM's second half
    ("torch_small_train", "vectorized_elementwise_kernel", Category.ELEMENTWISE),
    ("jax_small_train", "gemm_fusion_dot", Category.GEMM),
    ("jax_small_train", "loop_add_fusion", Category.ELEMENTWISE),
    ("jax_small_train", "input_transpose_fusion", Category.MEMORY),
    ("jax_small_train", "RedzoneAllocatorKernelImpl", Category.AUTOTUNING),
    ("jax_small_train", "DelayKernel", Category.AUTOTUNING),
    ("jax_small_train", "xla_fp_comparison", Category.AUTOTUNING),
])
def test_fixture_names(scenario: str, fragment: str, category: Category) -> None:
    matching = [n for n in _names(scenario) if fragment in n]
    assert matching, f"{fragment} not in {scenario}"
    assert {classify(n) for n in matching} == {category}


def test_fixture_gemm_transposes_follow_the_linear_layer() -> None:
    """Forward runs Y = X W^T as `tn` (its attention matmuls add `nn`); backward's dX and
    dW need `nn` and `nt`, and only backward has `nt`."""
    from pathlib import Path

    from harness.trace.analyses.breakdown import breakdown, load_profile

    path = Path(__file__).parent / "data" / "torch_small_train" / "torch_small_train.sqlite.gz"
    phases = breakdown(load_profile(path)).phases
    fwd = {k.gemm.transpose for k in phases["forward"].kernels if k.gemm and k.gemm.transpose}
    bwd = {k.gemm.transpose for k in phases["backward"].kernels if k.gemm and k.gemm.transpose}
    top = next(k for k in phases["forward"].kernels if k.gemm)
    assert top.gemm.transpose == "tn" and "nt" not in fwd
    assert {"nn", "nt"} <= bwd


# -- Inductor (torch.compile) --------------------------------------------------------
# Triton kernel names as Inductor builds them: triton_<kind>_fused_<sorted ATen ops>_<n>.
# The op lists are those Inductor gave the tiny model's training step (fp32 and bf16
# autocast) on the CPU, where the same names start with cpp_fused_; the kind is the one
# the GPU gives that kernel (a norm or softmax row is one persistent reduction).
INDUCTOR = {
    # RMSNorm forward (the first fused with the embedding gather) and backward
    "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0": Category.NORM,
    "triton_per_fused__to_copy_add_index_mean_mul_pow_rsqrt_slice_t_0": Category.NORM,
    "triton_per_fused_add_div_expand_mul_pow_sum_view_1": Category.NORM,
    "triton_red_fused__to_copy_mul_sum_7": Category.REDUCTION,  # the norm weight's gradient
    # attention softmax, the loss (log_softmax + nll_loss) and their backward
    "triton_per_fused__softmax_1": Category.SOFTMAX,
    "triton_per_fused__softmax__to_copy__unsafe_view_arange_bitwise_not_clone_masked_fill_mul_ones_transpose_tril_view_3": Category.SOFTMAX,
    "triton_per_fused__softmax_backward_data_masked_fill_mul_nll_loss_forward_view_5": Category.SOFTMAX,
    "triton_red_fused__log_softmax_nll_loss_3": Category.SOFTMAX,
    "triton_red_fused__log_softmax__unsafe_view_clone_nll_loss_forward_slice_6": Category.SOFTMAX,
    "triton_poi_fused__log_softmax__log_softmax_backward_data__unsafe_view_arange_clone_eq_expand_nll_loss_backward_nll_loss_forward_scalar_tensor_slice_view_0": Category.SOFTMAX,
    "triton_per_fused_amax_div_exp_sub_sum_2": Category.SOFTMAX,  # softmax written out
    # pointwise: SwiGLU, residual adds, RoPE (its pow is theta**(-2i/d), not a norm)
    "triton_poi_fused_add_mul_silu_2": Category.ELEMENTWISE,
    "triton_poi_fused__unsafe_view_mul_silu_silu_backward_view_2": Category.ELEMENTWISE,
    "triton_poi_fused__unsafe_view_add_2": Category.ELEMENTWISE,
    "triton_poi_fused__unsafe_view_add_arange_cos_div_mul_neg_pow_sin_slice_stack_sub_transpose_unsqueeze_view_1": Category.ELEMENTWISE,
    # copies, views and casts only (head split/merge, bf16 weight casts)
    "triton_poi_fused_clone_transpose_view_3": Category.MEMORY,
    "triton_poi_fused__unsafe_view_clone_transpose_view_7": Category.MEMORY,
    "triton_poi_fused__to_copy_t_1": Category.MEMORY,
    "triton_poi_fused__to_copy_3": Category.MEMORY,
    # GEMM templates (max-autotune), cuBLAS's Hopper GEMMs behind extern mm
    "triton_tem_fused_mm_4": Category.GEMM,
    "triton_tem_fused__unsafe_view_addmm_t_0": Category.GEMM,
    "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT": Category.GEMM,
    # the compiled AdamW (foreach kernels) and the eager foreach AdamW's multi-tensor kernels
    "triton_for_fused_0": Category.OPTIMIZER,
    "triton_for_fused__foreach_add__foreach_addcdiv__foreach_addcmul__foreach_mul__foreach_sqrt_copy__unbind_0": Category.OPTIMIZER,
    "triton_poi_fused__foreach_add__foreach_addcdiv__foreach_addcmul__foreach_mul__foreach_sqrt_copy__unbind_1": Category.OPTIMIZER,
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListScalarListMetadata<float, 3>, at::native::(anonymous namespace)::PointwiseOpScalarListFunctor<float, 3, 3, 0>, std::divides<float> >(at::native::(anonymous namespace)::TensorListScalarListMetadata<float, 3>, at::native::(anonymous namespace)::PointwiseOpScalarListFunctor<float, 3, 3, 0>, std::divides<float>)": Category.OPTIMIZER,
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<1>, at::native::(anonymous namespace)::BinaryOpScalarFunctor<float, 1, 1, 0>, std::multiplies<float>, float>(at::native::(anonymous namespace)::TensorListMetadata<1>, at::native::(anonymous namespace)::BinaryOpScalarFunctor<float, 1, 1, 0>, std::multiplies<float>, float)": Category.OPTIMIZER,
}


@pytest.mark.parametrize("name,category", INDUCTOR.items())
def test_inductor_names(name: str, category: Category) -> None:
    assert classify(name) is category


def test_inductor_kind_decides_where_the_ops_do_not() -> None:
    # the same ops: a reduction with rsqrt is a norm, the pointwise kernel is not
    assert classify("triton_per_fused_add_mean_mul_pow_rsqrt_0") is Category.NORM
    assert classify("triton_poi_fused_add_mean_mul_pow_rsqrt_0") is Category.ELEMENTWISE
    # pow without a mean or sum (RoPE's frequencies) stays a reduction
    assert classify("triton_red_fused_mul_pow_0") is Category.REDUCTION
    # a copy with arithmetic is no longer memory
    assert classify("triton_poi_fused__to_copy_add_0") is Category.ELEMENTWISE
    # ops are whole words: _expand_ is not exp, _sum_ needs amax and exp beside it
    assert classify("triton_per_fused_amax_expand_sum_0") is Category.REDUCTION
    # in the optimizer range a fused pointwise update is the optimizer
    assert classify("triton_poi_fused_add_div_mul_sqrt_0", ("optimizer",)) is Category.OPTIMIZER


def test_nvjet_sm90_name_decodes() -> None:
    info = decode_gemm("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT")
    assert (info.arch, info.types, info.math, info.transpose, info.tile) == ("sm90", "tst", "bf16", "tn", "256x128")


@pytest.mark.slow
def test_inductor_names_its_kernels_after_the_fused_ops(inductor) -> None:
    """Inductor here (CPU) names kernels cpp_fused_<ops>_<n>, the GPU triton_<kind>_fused_
    <ops>_<n> with the same ops: with the GPU's prefix, today's names classify as above."""
    import re

    import torch
    import torch.nn.functional as F
    from torch._inductor.utils import run_and_get_code

    def parts(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w  # RMSNorm
        torch._dynamo.graph_break()
        e = torch.exp(h - h.amax(-1, keepdim=True))
        p = e / e.sum(-1, keepdim=True)  # softmax written out
        torch._dynamo.graph_break()
        return F.cross_entropy(p, y)  # log_softmax + nll_loss

    torch._dynamo.reset()
    _, codes = run_and_get_code(torch.compile(parts), torch.randn(8, 16), torch.ones(16), torch.randint(0, 16, (8,)))
    names = [n for code in codes for n in sorted(set(re.findall(r"\bcpp_fused_\w+", code)))]
    as_gpu = [n.replace("cpp_", "triton_per_", 1) for n in names]
    assert [classify(n) for n in as_gpu] == [Category.NORM, Category.SOFTMAX, Category.SOFTMAX], names


# -- what the kernel computes, from HTA's public traces (tests/data/hta) ---------------
# fbgemm_gpu's embedding, permute and fp8 kernels (their parameter lists name fbgemm_gpu
# types: "gemm" inside "fbgemm" is no GEMM); a ResNet's cuDNN convolutions, batch norms
# and pooling.
WHAT_IT_COMPUTES = {
    "void split_embedding_backward_codegen_rowwise_adagrad_unweighted_kernel_cta_per_row_1": Category.EMBEDDING,
    "void split_embedding_codegen_forward_unweighted_kernel": Category.EMBEDDING,
    "void bounds_check_indices_kernel<long, false>": Category.EMBEDDING,
    "void linearize_index_kernel<long>": Category.EMBEDDING,
    "void fbgemm_gpu::permute_2D_data_kernel<false, int, int, decltype(nullptr)>": Category.MEMORY,
    "void permute_pooled_embs_kernel<float>": Category.MEMORY,
    "void fbgemm_gpu::(anonymous namespace)::_compute_FP8_quantize_cuda_kernel<float>": Category.QUANTIZATION,
    "void fbgemm_gpu::(anonymous namespace)::_FP8rowwise_to_float_cuda_kernel<float>": Category.QUANTIZATION,
    "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x64_32x6_nt_align1>": Category.GEMM,
    "void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>": Category.CONVOLUTION,
    "void wgrad_alg0_engine<float, 128, 6, 7, 3, 3, 5, false, 512>": Category.CONVOLUTION,
    "cudnn_infer_volta_scudnn_128x64_relu_medium_nn_v1": Category.CONVOLUTION,
    "cudnn_infer_volta_scudnn_128x64_3dconv_fprop_medium_nn_v1": Category.CONVOLUTION,
    "void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>": Category.CONVOLUTION,
    "void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 128, true, 1>": Category.NORM,
    "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 128, true, 1, true>": Category.NORM,
    "void at::native::(anonymous namespace)::max_pool_backward_nchw<float, float>": Category.POOLING,
}


def _hta_names() -> dict[str, str]:
    """own name -> full name of every kernel in the HTA fixtures."""
    from pathlib import Path

    from harness.trace.kernels import own_name
    from harness.trace.sources.kineto import load_torch_trace

    out = {}
    for f in ("sampled_rank-0.json.gz", "ns_resolution_rank0.json.gz"):
        for n in load_torch_trace(Path(__file__).parent / "data" / "hta" / f).kernels.names:
            out.setdefault(own_name(n), n)
    return out


@pytest.mark.parametrize("own,category", WHAT_IT_COMPUTES.items())
def test_hta_names_by_what_they_compute(own: str, category: Category) -> None:
    names = _hta_names()
    full = [n for o, n in names.items() if o.startswith(own)]
    assert full, f"{own} not in the HTA fixtures"
    assert {classify(n) for n in full} == {category}


def test_words_not_substrings() -> None:
    # fp8 quantization inside an elementwise kernel's functor: quantization, not GEMM
    names = _hta_names()
    hfp8 = [n for n in names.values() if "_float_to_hfp8_gpu" in n]
    assert hfp8 and all(classify(n) is Category.QUANTIZATION for n in hfp8)
    # "conv" does not start "convert"
    assert classify("void at::native::convert_indices_from_coo_to_csr_cuda_kernel<int>") is not Category.CONVOLUTION


def test_shortened_names_keep_their_distinguishing_part() -> None:
    from harness.trace.kernels import short_name

    name = ("void at::native::(anonymous namespace)::CatArrayBatchedCopy_aligned16_contig<at::native::(anonymous "
            "namespace)::OpaqueType<4u>, unsigned int, 1, 128, 1>(at::native::(anonymous namespace)::OpaqueType<4u>*)")
    assert short_name(name, 200) == ("at::native::CatArrayBatchedCopy_aligned16_contig<at::native::OpaqueType<4u>, "
                                     "unsigned int, 1, 128, 1>")


def test_nsys_and_kineto_spellings_of_one_kernel_are_one_name() -> None:
    """The same kernels as nsys's demangler and torch.profiler (the C++ ABI) wrote them, from
    tests/data/user_profiles (one DDP loop under both tools)."""
    from harness.trace.kernels import canonical_name

    pairs = [
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)",
         "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"),
        ("void at::native::<unnamed>::GammaBetaBackwardCUDAKernelTemplate<float, float, (unsigned int)32, "
         "(unsigned int)32, (unsigned int)256, (bool)0, (bool)1, (bool)0>(long, long, const T1 *)",
         "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<float, float, 32u, 32u, "
         "256u, false, true, false>(long, long, float const*)"),
        ("[CUDA memcpy]", "Memcpy DtoD (Device -> Device)"),
    ]
    for nsys, kineto in pairs:
        assert canonical_name(nsys) == canonical_name(kineto)


def test_xla_s_numbered_kernels_are_compared_by_stem_where_two_programs_number_them_apart() -> None:
    """Names from the one- and two-device programs of JAX's step (the second-device profiles):
    XLA's numbers differ between programs, so those names are compared by stem; a stem whose
    names are the same on both sides, or that only one program has, keeps its names."""
    a = {"gemm_fusion_dot_1297", "loop_reduce_fusion_141", "add_rms_norm_bwd__1", "add_rms_norm_bwd__2",
         "loop_add_fusion_4", "nvjet_sm90_tst_128x160_64x5_2x1_v_bz_TNT"}
    b = {"gemm_fusion_dot_1942", "loop_reduce_fusion_2", "add_rms_norm_bwd", "loop_add_fusion_4",
         "wrapped_concatenate_70", "nvjet_sm90_tst_128x160_64x5_2x1_v_bz_TNT"}
    got = kernels.across_programs(a, b)
    assert got == {"gemm_fusion_dot_1297": "gemm_fusion_dot_*", "gemm_fusion_dot_1942": "gemm_fusion_dot_*",
                   "loop_reduce_fusion_141": "loop_reduce_fusion_*", "loop_reduce_fusion_2": "loop_reduce_fusion_*",
                   "add_rms_norm_bwd__1": "add_rms_norm_bwd_*", "add_rms_norm_bwd__2": "add_rms_norm_bwd_*",
                   "add_rms_norm_bwd": "add_rms_norm_bwd_*", "loop_add_fusion_4": "loop_add_fusion_4",
                   "wrapped_concatenate_70": "wrapped_concatenate_70",
                   "nvjet_sm90_tst_128x160_64x5_2x1_v_bz_TNT": "nvjet_sm90_tst_128x160_64x5_2x1_v_bz_TNT"}
    assert kernels.across_programs(a, a) == {name: name for name in a}
