"""torch's linear layers on cuBLASLt GEMMs whose algorithm is chosen by timing, as XLA chooses its own.

For a bf16 GEMM torch calls cuBLAS, which runs the first algorithm of its heuristic. XLA asks
cuBLASLt for the heuristic's candidates when it compiles a program, times each on the GPU and
keeps the fastest. At `large`'s shapes on Hopper the two picks differ, and the heuristic's is the
slower one. `TunedLinear` gives the torch model XLA's procedure: each linear layer's forward
and both of its backward products run `xfprof::lt_mm`, a custom op that calls
`cublasLtMatmul` with the algorithm that timed fastest for that problem (size, layouts,
dtype) on its first call. torch.compile sees the op as one extern kernel, as it sees torch's
own matmuls; its fusions around the GEMMs are unchanged.

`operand_layout` and `gemm_problem` hold the row-major to column-major bookkeeping; they run
without a GPU. The rest needs CUDA and the cuBLASLt that torch loaded.
"""

from __future__ import annotations

import ctypes
import dataclasses
import statistics

import torch

from torch_impl.model import Linear

OP_N, OP_T = 0, 1
_COMPUTE_32F = 68  # cublasComputeType_t: float32 accumulation
_R_32F = 0  # cudaDataType_t of alpha and beta
_DATA_TYPES = {torch.bfloat16: 14, torch.float16: 2}  # cudaDataType_t: CUDA_R_16BF, CUDA_R_16F
_DESC_TRANSA, _DESC_TRANSB = 3, 4  # cublasLtMatmulDescAttributes_t
_PREF_MAX_WORKSPACE_BYTES = 1  # cublasLtMatmulPreferenceAttributes_t
WORKSPACE_BYTES = 32 << 20
CANDIDATES = 16  # heuristic results timed per problem
TIMED_CALLS = 10


@dataclasses.dataclass(frozen=True)
class Operand:
    """A row-major 2-D tensor as cuBLASLt's column-major API takes it: `op` applied to the
    `rows` x `cols` column-major matrix with leading dimension `ld` gives the tensor's transpose."""

    op: int
    rows: int
    cols: int
    ld: int


def operand_layout(shape: tuple[int, int], strides: tuple[int, int]) -> Operand | None:
    """The column-major view of a [R, C] tensor whose transpose cuBLASLt reads without a copy:
    row-major rows (stride (ld, 1)) are a C x R column-major matrix, already the transpose;
    column-major (stride (1, ld)) is the R x C matrix itself, transposed by OP_T. None where
    neither holds (the caller copies)."""
    r, c = shape
    if strides[1] == 1 and strides[0] >= max(c, 1):
        return Operand(OP_N, c, r, strides[0])
    if strides[0] == 1 and strides[1] >= max(r, 1):
        return Operand(OP_T, r, c, strides[1])
    return None


def gemm_problem(a: Operand, b: Operand, m: int, n: int, k: int) -> tuple:
    """cuBLASLt's problem for row-major D[m, n] = a[m, k] @ b[k, n]: in column-major terms
    D^T = b^T a^T, so cuBLASLt's A is b's memory and its B is a's; the key of the timed choice."""
    return (b.op, a.op, n, m, k, b.rows, b.cols, b.ld, a.rows, a.cols, a.ld)


class _HeuristicResult(ctypes.Structure):
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves_count", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def _find_cublaslt() -> ctypes.CDLL:
    """The cuBLASLt library this process's torch loaded (its cuBLAS depends on it)."""
    torch.cuda.current_blas_handle()
    with open("/proc/self/maps") as maps:
        paths = [line.split()[-1] for line in maps if "libcublasLt.so" in line]
    if not paths:
        raise RuntimeError("cuBLASLt is not loaded in this process; --gemm tuned needs torch built with CUDA")
    lib = ctypes.CDLL(paths[0])
    p, size, i32, u64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int32, ctypes.c_uint64
    lib.cublasLtMatmul.argtypes = [p] * 13 + [p, size, p]
    lib.cublasLtMatmulAlgoGetHeuristic.argtypes = [p] * 7 + [i32, p, p]
    lib.cublasLtMatrixLayoutCreate.argtypes = [p, i32, u64, u64, ctypes.c_int64]
    lib.cublasLtMatmulDescCreate.argtypes = [p, i32, i32]
    lib.cublasLtMatmulDescSetAttribute.argtypes = [p, i32, p, size]
    lib.cublasLtMatmulPreferenceSetAttribute.argtypes = [p, i32, p, size]
    return lib


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"cuBLASLt {what} failed with status {status}")


@dataclasses.dataclass
class _Plan:
    desc: ctypes.c_void_p
    layouts: tuple  # A, B, D
    algo: _HeuristicResult
    candidates: int
    times_us: list


class _Lt:
    """One cuBLASLt handle and workspace per process and device, and the timed plan per problem."""

    def __init__(self) -> None:
        self.lib = _find_cublaslt()
        self.handle = ctypes.c_void_p()
        _check(self.lib.cublasLtCreate(ctypes.byref(self.handle)), "handle creation")
        self.workspaces: dict[int, torch.Tensor] = {}
        self.plans: dict[tuple, _Plan] = {}
        self.one, self.zero = ctypes.c_float(1.0), ctypes.c_float(0.0)

    def workspace(self, device: torch.device) -> torch.Tensor:
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in self.workspaces:
            self.workspaces[index] = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        return self.workspaces[index]

    def _layout(self, dtype: int, rows: int, cols: int, ld: int) -> ctypes.c_void_p:
        layout = ctypes.c_void_p()
        _check(self.lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), dtype, rows, cols, ld), "layout creation")
        return layout

    def plan(self, key: tuple, dtype: torch.dtype, run) -> _Plan:
        opa, opb, m, n, k, ar, ac, lda, br, bc, ldb = key
        lt_type = _DATA_TYPES[dtype]
        desc = ctypes.c_void_p()
        _check(self.lib.cublasLtMatmulDescCreate(ctypes.byref(desc), _COMPUTE_32F, _R_32F), "descriptor creation")
        for attribute, op in ((_DESC_TRANSA, opa), (_DESC_TRANSB, opb)):
            value = ctypes.c_int32(op)
            _check(self.lib.cublasLtMatmulDescSetAttribute(desc, attribute, ctypes.byref(value), 4), "transpose")
        layouts = (self._layout(lt_type, ar, ac, lda), self._layout(lt_type, br, bc, ldb), self._layout(lt_type, m, n, m))
        pref = ctypes.c_void_p()
        _check(self.lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "preference creation")
        limit = ctypes.c_uint64(WORKSPACE_BYTES)
        _check(self.lib.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_MAX_WORKSPACE_BYTES, ctypes.byref(limit), 8),
               "workspace limit")
        results = (_HeuristicResult * CANDIDATES)()
        found = ctypes.c_int(0)
        _check(self.lib.cublasLtMatmulAlgoGetHeuristic(self.handle, desc, layouts[0], layouts[1], layouts[2], layouts[2],
                                                         pref, CANDIDATES, results, ctypes.byref(found)), "heuristic")
        self.lib.cublasLtMatmulPreferenceDestroy(pref)
        usable = [results[i] for i in range(found.value) if results[i].state == 0]
        if not usable:
            raise RuntimeError(f"cuBLASLt has no algorithm for the GEMM {m} x {n} x {k}")
        plan = _Plan(desc, layouts, usable[0], len(usable), [])
        if len(usable) > 1 and not torch.cuda.is_current_stream_capturing():
            times = [_time_us(lambda r=r: run(plan, r)) for r in usable]
            plan.algo = usable[min(range(len(usable)), key=lambda i: times[i])]
            plan.times_us = times
        return plan

    def matmul(self, plan: _Plan, algo: _HeuristicResult, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> int:
        """D = A B with cuBLASLt's A the memory of `b` and its B that of `a` (see `gemm_problem`)."""
        workspace = self.workspace(out.device)
        return self.lib.cublasLtMatmul(
            self.handle, plan.desc, ctypes.byref(self.one), b.data_ptr(), plan.layouts[0], a.data_ptr(), plan.layouts[1],
            ctypes.byref(self.zero), out.data_ptr(), plan.layouts[2], out.data_ptr(), plan.layouts[2],
            ctypes.byref(algo.algo), workspace.data_ptr(), WORKSPACE_BYTES, torch.cuda.current_stream(out.device).cuda_stream)


def _time_us(call) -> float:
    """Median time of `call` on the GPU over TIMED_CALLS calls after two untimed ones;
    inf where cuBLASLt refuses the algorithm."""
    if call() != 0 or call() != 0:
        return float("inf")
    times = []
    for _ in range(TIMED_CALLS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


_LT: _Lt | None = None


def _lt() -> _Lt:
    global _LT
    if _LT is None:
        _LT = _Lt()
    return _LT


def _as_operand(t: torch.Tensor) -> tuple[torch.Tensor, Operand]:
    layout = operand_layout(tuple(t.shape), tuple(t.stride()))
    if layout is None or t.data_ptr() % 16:  # a fresh row-major copy (torch's contiguous() may keep odd strides of size-1 dims)
        t = torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t)
        layout = operand_layout(tuple(t.shape), tuple(t.stride()))
    return t, layout


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    m, k = a.shape
    n = b.shape[1]
    if a.device.type != "cuda" or a.dtype not in _DATA_TYPES or a.dtype != b.dtype or 0 in (m, n, k):
        return a @ b
    a, la = _as_operand(a)
    b, lb = _as_operand(b)
    out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    lt = _lt()
    key = (*gemm_problem(la, lb, m, n, k), a.dtype, a.device.index)
    plan = lt.plans.get(key)
    if plan is None:
        plan = lt.plans[key] = lt.plan(key[:-2], a.dtype, lambda p, algo: lt.matmul(p, algo, a, b, out))
    _check(lt.matmul(plan, plan.algo, a, b, out), "matmul")
    return out


@torch.library.custom_op("xfprof::lt_mm", mutates_args=())
def lt_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for 2-D a [m, k] and b [k, n], on CUDA in bf16/fp16 through cuBLASLt's timed choice
    (either operand row- or column-major, no copy); elsewhere torch's matmul."""
    return _matmul(a, b)


@lt_mm.register_fake
def _(a, b):
    return a.new_empty((a.shape[0], b.shape[1]))


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad: torch.Tensor):
    a, b = ctx.saved_tensors
    grad_a = lt_mm(grad, b.t()) if ctx.needs_input_grad[0] else None
    # b's gradient a^T grad, computed as (grad^T a)^T: for a linear layer (b = W^T) the product
    # lands in W's own [d_out, d_in] row-major order.
    grad_b = lt_mm(grad.t(), a).t() if ctx.needs_input_grad[1] else None
    return grad_a, grad_b


lt_mm.register_autograd(_backward, setup_context=_setup_context)


def plans() -> list[dict]:
    """The timed choices of this process so far: the problem, the candidates and their times."""
    if _LT is None:
        return []
    return [dict(problem=list(key[:-2]), dtype=str(key[-2]), candidates=plan.candidates,
                 times_us=[round(t, 1) for t in plan.times_us]) for key, plan in _LT.plans.items()]


def tuned_linear(x: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """F.linear(x, weight) in `dtype` (the cast autocast would make) through `lt_mm`."""
    x, weight = x.to(dtype), weight.to(dtype)
    y = lt_mm(x.reshape(-1, x.shape[-1]), weight.t())
    return y.view(*x.shape[:-1], weight.shape[0])


class TunedLinear(Linear):
    """torch_impl's Linear with its GEMMs through `lt_mm`, in `compute_dtype`."""

    compute_dtype = torch.bfloat16

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return tuned_linear(x, self.weight, self.compute_dtype)


def use_tuned_gemms(model: torch.nn.Module) -> int:
    """Switch every torch_impl Linear of `model` to `TunedLinear` in place (parameters, names and
    hooks unchanged); the number switched."""
    switched = 0
    for module in model.modules():
        if type(module) is Linear:
            module.__class__ = TunedLinear
            switched += 1
    return switched
