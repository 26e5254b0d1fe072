import os

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
