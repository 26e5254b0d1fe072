"""One training step of torch_impl, split into phases the harness can time.

`TorchSession` and `harness.timing.jax_backend.JaxSession` have the same methods and
signatures, so the timer and the parity check drive either without asking which."""

from __future__ import annotations

import contextlib

import numpy as np
import torch

import torch_impl
from harness.config import ModelConfig

PRECISION = {
    "fp32": "everything in float32; TF32 off for matmuls and cuDNN",
    "tf32": "float32 storage; matmuls and convolutions on TF32 tensor cores",
    "bf16": (
        "torch.autocast(bfloat16): matmul inputs (linear layers, attention products, SDPA) cast "
        "to bf16 with bf16 outputs; embedding, residual stream, RMSNorm (float32 inside), softmax "
        "and loss in float32; float32 master weights, gradients and AdamW state"
    ),
}


def init_model(config: ModelConfig, seed: int) -> torch_impl.TransformerLM:
    """The reference initialisation both backends start from: torch_impl on CPU with `seed`."""
    torch.manual_seed(seed)
    return torch_impl.TransformerLM(config)


def set_matmul_precision(dtype: str) -> None:
    allow = dtype == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow


class TorchSession:
    """Model, optimizer and one token batch on `device`, with each phase as a method.

    `weights`: a torch_impl model to start from (the shared initialisation); None builds
    one from `seed`."""

    backend = "torch"

    def __init__(self, config: ModelConfig, tokens: np.ndarray, *, device: str, dtype: str, seed: int,
                 weights: torch_impl.TransformerLM | None = None) -> None:
        set_matmul_precision(dtype)
        self.device = torch.device(device)
        self.dtype = dtype
        self.model = (weights or init_model(config, seed)).to(self.device)
        self.optimizer = torch_impl.AdamW(self.model.parameters())
        batch = torch.from_numpy(tokens).to(self.device)
        self.inputs, self.targets = batch[:, :-1], batch[:, 1:]
        self._loss: torch.Tensor | None = None

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def sync(self, value: object = None) -> None:
        """Wait for the device's queued work (`value` is accepted for JaxSession's signature)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # -- phases ---------------------------------------------------------------------
    def forward(self, *, grad: bool = True) -> torch.Tensor:
        with torch.set_grad_enabled(grad), self.autocast():
            self._loss = torch_impl.cross_entropy_loss(self.model(self.inputs), self.targets)
        return self._loss.detach()

    def backward(self) -> None:
        self._loss.backward()
        self._loss = None

    def optimizer_step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def plain_step(self) -> torch.Tensor:
        """forward + backward + optimizer with no ranges and no synchronization."""
        loss = self.forward()
        self.backward()
        self.optimizer_step()
        return loss

    def fused_step(self) -> torch.Tensor:
        """Eager torch has no compiler to fuse across phases: its fused step is the plain one."""
        return self.plain_step()

    # -- memory ---------------------------------------------------------------------
    def reset_peak_memory(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def peak_memory(self) -> int | None:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device)
        return None

    # -- values for parity ----------------------------------------------------------
    def logits(self) -> np.ndarray:
        with torch.no_grad(), self.autocast():
            return self.model(self.inputs).float().cpu().numpy().copy()

    def loss_and_grads(self) -> tuple[float, dict[str, np.ndarray]]:
        self.zero_grad()
        loss = self.forward()
        self.backward()
        grads = {n: p.grad.detach().float().cpu().numpy().copy() for n, p in self.model.named_parameters()}
        return float(loss), grads

    def params(self) -> dict[str, np.ndarray]:
        return {n: p.detach().float().cpu().numpy().copy() for n, p in self.model.named_parameters()}

    def device_name(self) -> str | None:
        return torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None

    def versions(self) -> dict:
        return {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}
