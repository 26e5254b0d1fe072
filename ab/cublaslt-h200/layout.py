import json, statistics, time, torch
M = 32768
def timed(f, calls=20):
    f(); torch.cuda.synchronize(); t_end = time.perf_counter() + 0.1
    while time.perf_counter() < t_end: f()
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(calls): f()
    torch.cuda.synchronize(); return (time.perf_counter() - t0) / calls * 1e6
for name, K, N in [("qkvo", 1280, 1280), ("w1/w3", 1280, 5120), ("w2", 5120, 1280)]:
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16); w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    wt = w.t().contiguous(); g = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    pairs = {"fwd": (lambda: x @ w.t(), lambda: x @ wt), "dgrad": (lambda: g @ w, lambda: g @ wt.t()),
             "wgrad": (lambda: g.t() @ x, lambda: x.t() @ g)}
    for op, (f0, f1) in pairs.items():
        t0, t1 = [], []
        for _ in range(3): t0.append(timed(f0)); t1.append(timed(f1))
        print(json.dumps(dict(gemm=name, op=op, w_dout_din_us=round(statistics.median(t0), 1), w_din_dout_us=round(statistics.median(t1), 1))), flush=True)
