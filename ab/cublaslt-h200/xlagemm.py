"""Which cuBLASLt problem XLA poses for the step's GEMMs, against torch's: the cuBLASLt each
process loaded (path, version), XLA's optimized HLO (the cublas$lt$matmul / gemm custom calls with
their backend_config: layouts, epilogue, algorithm) and its autotuning results, for x[32768,1280] @ W."""
import ctypes, glob, json, os, subprocess, sys
mode = sys.argv[1] if len(sys.argv) > 1 else "driver"
def lt_loaded():
    with open("/proc/self/maps") as f:
        paths = sorted({l.split()[-1] for l in f if "libcublasLt.so" in l or "libcublas.so" in l})
    out = {}
    for p in paths:
        if "libcublasLt" in p:
            lib = ctypes.CDLL(p); lib.cublasLtGetVersion.restype = ctypes.c_size_t
            out[p] = lib.cublasLtGetVersion()
        else:
            out[p] = None
    return out
if mode == "torch":
    import torch
    torch.cuda.current_blas_handle()
    print(json.dumps(dict(side="torch", libs=lt_loaded())))
elif mode == "jax":
    os.environ["XLA_FLAGS"] = "--xla_dump_to=XD --xla_dump_hlo_pass_re=^$ --xla_gpu_dump_autotune_results_to=XD/autotune.txt"
    import jax, jax.numpy as jnp
    M, K, N = 32768, 1280, 5120
    x = jnp.ones((M, K), jnp.bfloat16); w = jnp.ones((N, K), jnp.bfloat16)
    f = jax.jit(lambda x, w: x @ w.T)  # the model's layout: W [d_out, d_in], y = x W^T
    g = jax.jit(lambda x, w: x @ w)    # W [d_in, d_out]
    jax.block_until_ready(f(x, w)); jax.block_until_ready(g(x, w.T))
    print(json.dumps(dict(side="jax", libs=lt_loaded())))
    for path in sorted(glob.glob("XD/*after_optimizations.txt")):
        for line in open(path):
            if "custom_call_target" in line and ("gemm" in line or "cublas" in line):
                print(os.path.basename(path)[:60], line.strip()[:1500])
    if os.path.exists("XD/autotune.txt"):
        print(open("XD/autotune.txt").read()[:6000])
else:
    for m in ("torch", "jax"):
        subprocess.run([sys.executable, __file__, m], check=False)
