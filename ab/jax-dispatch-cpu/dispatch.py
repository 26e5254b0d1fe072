import time, statistics, numpy as np, jax
from harness.config import ModelConfig
from harness.backends.jax.session import JaxSession
for layers in (4, 12, 36):
    cfg = ModelConfig(name="probe", vocab_size=512, d_model=64, d_ff=128, num_layers=layers, num_heads=2)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (1, 17))
    s = JaxSession(cfg, tokens, device="cpu", dtype="fp32", seed=0)
    for _ in range(3):
        s.sync(s.fused_step())
    disp, total = [], []
    for _ in range(30):
        s.sync()
        t0 = time.perf_counter(); loss = s.fused_step(); t1 = time.perf_counter(); s.sync(loss); s.sync(); t2 = time.perf_counter()
        disp.append(t1 - t0); total.append(t2 - t0)
    n = len(jax.tree.leaves((s.state, s.opt_state)))
    print(f"layers {layers}: {n} arrays in, dispatch median {statistics.median(disp)*1e3:.2f} ms, step median {statistics.median(total)*1e3:.2f} ms", flush=True)
