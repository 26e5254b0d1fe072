"""The profiler target: one forward+backward of the kernel, in interpret mode on CPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harness import attention_once
from pallas_kernels import mha_reference


@pytest.mark.parametrize("blocks", [[], ["--blocks", "block_q=16,block_k=16"]], ids=["default", "blocks"])
def test_gradients_match_reference(blocks) -> None:
    args = attention_once.parse_args(["--device", "cpu", "--kernel", "triton", "--batch", "1", "--seq", "40",
                                      "--heads", "2", "--head-dim", "16", "--dtype", "fp32", *blocks])
    if blocks:
        assert (args.block_sizes.block_q, args.block_sizes.block_k) == (16, 16)
    with jax.default_device(jax.devices("cpu")[0]):
        got = attention_once.run(args)
        q, k, v = (jax.random.normal(jax.random.key(i), (1, 40, 2, 16), jnp.float32) for i in range(3))
        want = jax.grad(lambda q, k, v: mha_reference(q, k, v, causal=True).sum(), argnums=(0, 1, 2))(q, k, v)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=2e-4, rtol=2e-4)


def test_bad_input_is_reported(capsys) -> None:
    rc = attention_once.main(["--device", "cpu", "--seq", "8", "--head-dim", "300"])
    assert rc == 2
    assert "head_dim=300" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--seq", "0"], ["--blocks", "block_q=16"], ["--kernel", "mosaic", "--blocks", "x"],
                                  ["--kernel", "mosaic", "--blocks", "consumers=3,overlap=true"],
                                  ["--kernel", "triton", "--blocks", "block_q=big"]])
def test_rejects_bad_arguments(argv, capsys) -> None:
    with pytest.raises(SystemExit):
        attention_once.parse_args(argv)
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("argv, rc, stream, text", [
    (["--kernel", "triton", "--seq", "24", "--heads", "1", "--head-dim", "16", "--dtype", "fp32"], 0, "stdout",
     "attention_once: triton fp32 1x24x1x16 causal=true ran 2x"),
    (["--seq", "8", "--head-dim", "300"], 2, "stderr", "head_dim=300"),
], ids=["ok", "bad-input"])
def test_command_line_exit_status_and_output(argv, rc, stream, text) -> None:
    """As a program it leaves without interpreter teardown (a profiler must see
    the exit); its status and its piped, block-buffered output still arrive."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # a pipe is then block-buffered
    got = subprocess.run([sys.executable, "-m", "harness.attention_once", "--device", "cpu", *argv],
                         capture_output=True, text=True, timeout=300, env=env)
    assert got.returncode == rc, got.stderr
    assert text in getattr(got, stream)
