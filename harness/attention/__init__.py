"""Attention tooling: benchmark, target check, block-size search, one-shot runs, Nsight Compute summaries.

PyTorch and JAX share the GPU in these tools, and JAX would otherwise reserve most of it
up front and starve PyTorch: importing this package turns JAX's preallocation off (before
JAX creates its GPU client) unless the environment already says otherwise.
"""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
