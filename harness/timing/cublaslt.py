"""cuBLASLt's candidate algorithms for one GEMM, and a call of any of them, from Python.

For a bf16 matmul torch asks cuBLAS, which runs its heuristic's first algorithm. XLA asks
cuBLASLt's heuristic for its candidates when it compiles a program, times each on the GPU and
keeps the fastest (the custom call's `selected_algorithm` is that candidate's index). Both
frameworks load the same cuBLASLt, so the candidate list of a problem, asked for the same way,
is the list both choose from. `Lt` asks for it (`candidates`) and runs any one of them
(`matmul`), through ctypes on the library torch loaded.

`operand_layout` and `gemm_problem` hold the row-major to column-major bookkeeping and run
without a GPU; the rest needs CUDA.
"""

from __future__ import annotations

import ctypes
import dataclasses

OP_N, OP_T = 0, 1
COMPUTE_32F = 68  # cublasComputeType_t CUBLAS_COMPUTE_32F: float32 accumulation
R_32F, R_16BF = 0, 14  # cudaDataType_t: alpha and beta in float32; bf16 operands
DESC_TRANSA, DESC_TRANSB = 3, 4  # cublasLtMatmulDescAttributes_t
PREF_MAX_WORKSPACE_BYTES = 1  # cublasLtMatmulPreferenceAttributes_t
WORKSPACE_BYTES = 32 << 20  # XLA's autotuning workspace (its custom calls' autotune_workspace_size)
REQUESTED = 128  # candidates asked for; the heuristic returns as many as it has


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
    row-major rows (strides (ld, 1)) are a C x R column-major matrix, already the transpose;
    column-major (strides (1, ld)) is the R x C matrix itself, transposed by OP_T. None where
    neither holds."""
    r, c = shape
    if strides[1] == 1 and strides[0] >= max(c, 1):
        return Operand(OP_N, c, r, strides[0])
    if strides[0] == 1 and strides[1] >= max(r, 1):
        return Operand(OP_T, r, c, strides[1])
    return None


def gemm_problem(a: Operand, b: Operand, m: int, n: int, k: int) -> tuple:
    """cuBLASLt's problem for row-major D[m, n] = a[m, k] @ b[k, n]. In column-major terms
    D^T = b^T a^T, so cuBLASLt's A is b's memory and its B is a's; D is n x m with ld n."""
    return (b.op, a.op, n, m, k, b.rows, b.cols, b.ld, a.rows, a.cols, a.ld)


def transposes(problem: tuple) -> str:
    """cuBLAS's two-letter name of a problem's transposes (A then B), as kernel names carry them."""
    return "".join("NT"[op] for op in problem[:2])


class _HeuristicResult(ctypes.Structure):
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves_count", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


@dataclasses.dataclass
class Candidate:
    """One algorithm of the heuristic's list: its index there (XLA's `selected_algorithm`) and
    the heuristic's estimate of its waves of output tiles over the GPU's SMs."""

    index: int
    waves: float
    result: _HeuristicResult


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"cuBLASLt {what} failed with status {status}")


def loaded_library() -> str:
    """The path of the cuBLASLt this process loaded (torch's cuBLAS depends on it)."""
    import torch

    torch.cuda.current_blas_handle()
    with open("/proc/self/maps") as maps:
        paths = sorted({line.split()[-1] for line in maps if "libcublasLt.so" in line})
    if not paths:
        raise RuntimeError("cuBLASLt is not loaded in this process: torch was built without CUDA")
    return paths[0]


def version() -> int:
    """cuBLASLt's version number (major * 10000 + minor * 100 + patch) of the library torch loaded."""
    lib = ctypes.CDLL(loaded_library())
    lib.cublasLtGetVersion.restype = ctypes.c_size_t
    return int(lib.cublasLtGetVersion())


class Lt:
    """One cuBLASLt handle and workspace on the current CUDA device."""

    def __init__(self) -> None:
        import torch

        self.path = loaded_library()
        lib = self.lib = ctypes.CDLL(self.path)
        p, size, i32, u64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int32, ctypes.c_uint64
        lib.cublasLtMatmul.argtypes = [p] * 13 + [p, size, p]
        lib.cublasLtMatmulAlgoGetHeuristic.argtypes = [p] * 7 + [i32, p, p]
        lib.cublasLtMatrixLayoutCreate.argtypes = [p, i32, u64, u64, ctypes.c_int64]
        lib.cublasLtMatmulDescCreate.argtypes = [p, i32, i32]
        lib.cublasLtMatmulDescSetAttribute.argtypes = [p, i32, p, size]
        lib.cublasLtMatmulPreferenceSetAttribute.argtypes = [p, i32, p, size]
        lib.cublasLtGetVersion.restype = size
        self.version = int(lib.cublasLtGetVersion())
        self.handle = ctypes.c_void_p()
        _check(lib.cublasLtCreate(ctypes.byref(self.handle)), "handle creation")
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
        self.one, self.zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self._kept: list = []  # descriptors and layouts live as long as the handle

    def _layout(self, rows: int, cols: int, ld: int) -> ctypes.c_void_p:
        layout = ctypes.c_void_p()
        _check(self.lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), R_16BF, rows, cols, ld), "layout creation")
        return layout

    def candidates(self, problem: tuple) -> tuple[tuple, list[Candidate]]:
        """The heuristic's usable candidates for a bf16 `problem` (`gemm_problem`), in its order,
        and the descriptor and layouts that `matmul` runs them with."""
        opa, opb, m, n, _, ar, ac, lda, br, bc, ldb = problem
        desc = ctypes.c_void_p()
        _check(self.lib.cublasLtMatmulDescCreate(ctypes.byref(desc), COMPUTE_32F, R_32F), "descriptor creation")
        for attribute, op in ((DESC_TRANSA, opa), (DESC_TRANSB, opb)):
            value = ctypes.c_int32(op)
            _check(self.lib.cublasLtMatmulDescSetAttribute(desc, attribute, ctypes.byref(value), 4), "transpose")
        layouts = (self._layout(ar, ac, lda), self._layout(br, bc, ldb), self._layout(m, n, m))
        pref = ctypes.c_void_p()
        _check(self.lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "preference creation")
        limit = ctypes.c_uint64(WORKSPACE_BYTES)
        _check(self.lib.cublasLtMatmulPreferenceSetAttribute(pref, PREF_MAX_WORKSPACE_BYTES, ctypes.byref(limit), 8),
               "workspace limit")
        results = (_HeuristicResult * REQUESTED)()
        found = ctypes.c_int(0)
        _check(self.lib.cublasLtMatmulAlgoGetHeuristic(self.handle, desc, layouts[0], layouts[1], layouts[2],
                                                         layouts[2], pref, REQUESTED, results, ctypes.byref(found)),
               "heuristic")
        self.lib.cublasLtMatmulPreferenceDestroy(pref)
        plan = (desc, layouts)
        self._kept.append(plan)
        return plan, [Candidate(i, float(results[i].waves_count), results[i])
                      for i in range(found.value) if results[i].state == 0]

    def matmul(self, plan: tuple, candidate: Candidate, a, b, out) -> int:
        """out = a @ b (row-major torch tensors of `plan`'s problem) with one candidate; cuBLASLt's
        status (0: done; another: this algorithm refused the problem)."""
        import torch

        desc, (la, lb, ld) = plan
        return self.lib.cublasLtMatmul(
            self.handle, desc, ctypes.byref(self.one), b.data_ptr(), la, a.data_ptr(), lb,
            ctypes.byref(self.zero), out.data_ptr(), ld, out.data_ptr(), ld, ctypes.byref(candidate.result.algo),
            self.workspace.data_ptr(), WORKSPACE_BYTES, torch.cuda.current_stream().cuda_stream)
