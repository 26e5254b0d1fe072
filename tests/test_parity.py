"""The parity check passes on correct models and fails on planted bugs."""

import math

import numpy as np
import pytest
import torch

from harness.backends.jax import TOLERANCES, convert
from harness.config import get_config
from harness.timing.parity import check_parity, rel_err
from tests.conftest import DEVICES
from torch_impl import model as tm

CFG = get_config("tiny")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_models_agree_within_the_tolerance_table(device, dtype):
    result = check_parity(CFG, batch=2, ctx=32, device=device, dtype=dtype)
    worst = {q: f"{r.tensor} {r.rel_err:.2e} > {r.tol:.0e}" for q, r in result.worst().items() if not r.ok}
    assert result.ok, worst
    names = {r.tensor for r in result.rows if r.quantity == "grad"}
    assert len(names) == 3 + CFG.num_layers * 9  # every parameter's gradient was compared
    if dtype == "fp32":  # float32 reorderings only: far inside the bounds
        assert max(r.rel_err for r in result.rows if r.quantity in ("logits", "grad")) < 1e-5


def test_fused_attention_parity():
    assert check_parity(get_config("tiny", attention="fused"), batch=1, ctx=16).ok


def _half_split_rope(x, cos, sin):
    """RoPE pairing (i, i + d/2) (the GPT-NeoX layout) instead of adjacent entries."""
    half = x.shape[-1] // 2
    return (x * cos[:, None, :] + torch.cat((x[..., half:], x[..., :half]), dim=-1) * sin[:, None, :]).to(x.dtype)


def _unscaled_scores(self, q, k):
    return q @ k.transpose(-2, -1)


def _swapping_torch_to_jax(torch_model, jax_model):
    """A conversion that copies w1 into w3 and w3 into w1."""
    sd = torch_model.state_dict()
    for i in range(len(torch_model.layers)):
        a, b = f"layers.{i}.ffn.w1.weight", f"layers.{i}.ffn.w3.weight"
        sd[a], sd[b] = sd[b].clone(), sd[a].clone()
    swapped = type(torch_model)(torch_model.config)
    swapped.load_state_dict(sd)
    _real_torch_to_jax(swapped, jax_model)


_real_torch_to_jax = convert.torch_to_jax


@pytest.mark.parametrize("bug, target, replacement", [
    ("wrong RoPE pairing", (tm, "apply_rope"), _half_split_rope),
    ("missing 1/sqrt(d_head) scale", (tm.CausalSelfAttention, "scores"), _unscaled_scores),
    ("swapped w1/w3 weights", (convert, "torch_to_jax"), _swapping_torch_to_jax),
])
def test_planted_bug_fails_the_check(monkeypatch, bug, target, replacement):
    monkeypatch.setattr(*target, replacement)
    if target[0] is convert:
        import harness.backends.jax.session

        monkeypatch.setattr(harness.backends.jax.session, "torch_to_jax", replacement)
    result = check_parity(CFG, batch=2, ctx=32)
    assert not result.ok, bug
    failed = {r.quantity for r in result.rows if not r.ok}
    assert {"logits", "loss", "grad"} <= failed, (bug, failed)
    # not a near miss: the errors are orders of magnitude over the bound
    logits = next(r for r in result.rows if r.quantity == "logits")
    assert logits.rel_err > 100 * logits.tol


def test_rel_err_edge_cases():
    assert rel_err(np.zeros(3), np.zeros(3)) == 0.0
    assert rel_err(np.array([np.nan]), np.ones(1)) == math.inf
    assert rel_err(np.array([1.1]), np.array([1.0])) == pytest.approx(0.1)


def test_tolerances_are_ordered_by_precision():
    for key in TOLERANCES["fp32"]:
        assert TOLERANCES["fp32"][key] <= TOLERANCES["tf32"][key] <= TOLERANCES["bf16"][key]


def test_parity_cli_prints_a_table_and_exit_code(capsys):
    from harness.parity import main

    assert main(["--model", "tiny", "--ctx", "16", "--batch", "1", "--device", "cpu", "--steps", "2",
                 "--backend", "jax"]) == 0
    out = capsys.readouterr().out
    assert "jax              grad     layers.1.ffn.w3.weight" in out
    lines = out.splitlines()
    rows = [line.split() for line in lines[3:] if line.endswith(("yes", "NO"))]
    closest = max(rows, key=lambda r: float(r[3]) / float(r[4]))  # read back from the printed table
    assert lines[1].startswith(f"PASS: all {len(rows)} tensors within their bounds; the closest to its bound: "
                               f"jax {closest[1]} {closest[2]}, ")  # the answer before the table


def test_the_verdict_names_the_tensors_over_their_bound():
    from harness.timing.parity import ParityResult, ParityRow, verdict

    rows = [ParityRow("grad", "w1", 0.2, 0.05, "jax"), ParityRow("loss", "loss", 1e-3, 1e-2, "jax"),
            ParityRow("param", "w2", 6e-3, 5e-3, "torch-compile")]
    result = ParityResult("tiny", "bf16", "cpu", 1, 16, 2, {"torch": "naive", "jax": "naive"}, rows)
    assert verdict(result) == ("FAIL: 2 of 3 tensors over their bound: jax grad w1 2.0e-01 (bound 5e-02), "
                               "torch-compile param w2 6.0e-03 (bound 5e-03)")
    result.rows = rows[1:2]
    assert verdict(result) == ("PASS: the one tensor within its bound; the closest to its bound: jax loss loss, "
                               "1.0e-03 against 1e-02")


def test_compiled_bounds_sit_inside_the_jax_bounds():
    """Eager and compiled torch run one program, so their fp32 bounds are tighter than
    torch against JAX; in the low-precision dtypes they are the same."""
    from harness.backends.torch import COMPILE_TOLERANCES
    from harness.timing.parity import tolerances

    for key, bound in COMPILE_TOLERANCES["fp32"].items():
        assert bound <= TOLERANCES["fp32"][key]
    assert tolerances("torch-compile-cg", "bf16") == TOLERANCES["bf16"] and tolerances("jax", "fp32") is TOLERANCES["fp32"]


def test_cpu_default_backends_leave_out_the_cuda_graph_one(capsys):
    """On a CPU nobody asked for torch-compile-cg, so parity neither runs it nor says it skips it."""
    from harness import parity
    from harness.backends import choose_backends

    assert parity.default_backends("cuda") == ("torch-compile", "torch-compile-cg", "jax")  # registry order
    chosen = choose_backends(None, parity.default_backends("cpu"), "cpu", "parity")
    assert "torch-compile-cg" not in chosen and "jax" in chosen
    assert "torch-compile-cg" not in capsys.readouterr().err


def test_a_stop_signal_during_parity_is_one_line(tmp_path):
    """SIGTERM while the steps run (what compare sends its parity child): exit 130, one line."""
    import os
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-m", "harness.parity", "--device", "cpu", "--backend", "jax",
                             "--steps", "100000"], cwd=os.path.dirname(os.path.dirname(__file__)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(12)  # past the imports: inside the steps
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
