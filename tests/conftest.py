import os
import subprocess
import sys
from pathlib import Path

# Tests run on the CPU unless a test asks for the GPU explicitly.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# One intra-op thread per process (and the subprocesses it starts): the tests' models are
# tiny, and with two workers on two cores a second OpenMP thread per process only waits for
# a core, spinning, and a tiny step took many times longer.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


HAS_GPU = _has_gpu()
requires_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=[requires_gpu, pytest.mark.gpu])]


@pytest.fixture(scope="session")
def inductor():
    """Skips when Inductor cannot build kernels here (on CPU it needs a C++ compiler)."""
    import torch

    try:
        torch.compile(lambda x: x * 2 + 1)(torch.ones(4))
    except (RuntimeError, OSError) as e:  # Inductor's build errors (BackendCompilerFailed, InvalidCxxCompiler)
        pytest.skip(f"torch.compile (Inductor) cannot compile here: {type(e).__name__}: {e}")


@pytest.fixture(autouse=True)
def _quiet_progress(monkeypatch):
    """Progress lines of long work (`harness.common.progress`) only where a test asks for
    them: on a busy machine a small profile can take past AFTER_S to read, and the lines
    would land in the output that a test checks."""
    from harness.common import progress

    monkeypatch.setattr(progress, "AFTER_S", 3600.0)


ROOT = Path(__file__).resolve().parent.parent


def on_host_devices(script: str, devices: int = 2) -> subprocess.CompletedProcess:
    """`script` run by a fresh Python on a CPU-only JAX with `devices` host devices (the
    count is fixed when JAX starts), the project on its path."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)


def tiny_jax_loss():
    """The tiny JAX model's loss over one fixed batch of 2 x 16 next-token pairs, as a function
    of its parameters: (config, loss, params, tokens), for tests that swap a kernel into the
    model and compare its loss and gradients."""
    import jax
    from flax import nnx

    import jax_impl
    from harness.config import get_config

    config = get_config("tiny")
    graphdef, params = nnx.split(jax_impl.TransformerLM(config, rngs=nnx.Rngs(0)), nnx.Param)
    tokens = jax.random.randint(jax.random.key(2), (2, 17), 0, config.vocab_size)

    def loss(params):
        logits = nnx.merge(graphdef, params)(tokens[:, :-1])
        return jax_impl.cross_entropy_loss(logits, tokens[:, 1:])

    return config, loss, params, tokens


class FakeClock:
    """time.perf_counter for code under test, advanced only by `sleep`: work that takes its
    time on it gives exact figures, however busy the machine is."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
