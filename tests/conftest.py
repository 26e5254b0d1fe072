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


class FakeClock:
    """time.perf_counter for code under test, advanced only by `sleep`: work that takes its
    time on it gives exact figures, however busy the machine is."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds



def on_two_host_devices(script: str) -> subprocess.CompletedProcess:
    """`python -c script` in a fresh process whose JAX CPU backend has two devices, run from the
    repository root: JAX fixes its device count when it starts, so a test in this process cannot
    split its CPU in two. Raises when it runs past ten minutes (a hung run; a busy machine is
    slow, not wrong)."""
    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu",
               # the tests' folder too, for a script that takes helpers from a test module
               PYTHONPATH=os.pathsep.join(p for p in (str(root), str(root / "tests"), env.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)
