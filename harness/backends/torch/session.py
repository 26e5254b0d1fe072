"""One training step of torch_impl, split into phases the harness can time.

`TorchSession` (eager) and `TorchCompileSession` (the same model through `torch.compile`)
implement `harness.backends.session.Session`, so the timer and the parity check drive any
of them without asking which; `harness.backends.torch` holds their records."""

from __future__ import annotations

import contextlib

import numpy as np
import torch

import torch_impl
from harness.backends.weights import init_model
from harness.config import OPTIMIZERS, ModelConfig


class Loss(torch.nn.Module):
    """torch_impl's cross-entropy as a module, so the harness can hang the `loss` layer
    range on it like on the model's own modules."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch_impl.cross_entropy_loss(logits, targets)


def set_matmul_precision(dtype: str) -> None:
    allow = dtype == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow


def make_optimizer(params, optimizer: str) -> torch_impl.AdamW:
    """torch_impl.AdamW as `--optimizer` names it (one of OPTIMIZERS)."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
    return torch_impl.AdamW(params, foreach=optimizer != "loop", compile=optimizer == "foreach-compiled",
                            fused=optimizer == "fused")


class TorchSession:
    """Model, optimizer and one token batch on `device`, with each phase as a method.

    `weights`: a torch_impl model to start from (the shared initialisation); None builds
    one from `seed`. `optimizer`: one of OPTIMIZERS."""

    backend = "torch"

    def __init__(self, config: ModelConfig, tokens: np.ndarray, *, device: str, dtype: str, seed: int,
                 weights: torch_impl.TransformerLM | None = None, optimizer: str = "fused") -> None:
        set_matmul_precision(dtype)
        self.device = torch.device(device)
        self.dtype = dtype
        self.model = (weights or init_model(config, seed)).to(self.device)
        self.optimizer = make_optimizer(self.model.parameters(), optimizer)
        batch = torch.from_numpy(tokens).to(self.device)
        self.inputs, self.targets = batch[:, :-1], batch[:, 1:]
        self.loss = Loss()
        self._loss: torch.Tensor | None = None

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def sync(self, value: object = None) -> None:
        """Wait for the device's queued work (`value` is accepted for JaxSession's signature)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def align(self) -> None:
        """`sync`, then a barrier over the process group when this is one rank of several."""
        self.sync()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.barrier()
            self.sync()

    def _loss_of(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with self.autocast():
            return self.loss(self.model(inputs), targets)

    def _logits_of(self, inputs: torch.Tensor) -> torch.Tensor:
        with self.autocast():
            return self.model(inputs).float()

    def layer_modules(self) -> dict[str, torch.nn.Module]:
        """The modules that get layer ranges (`harness.backends.ranges.layer_paths`), by path, and `loss`."""
        from harness.backends.ranges import layer_paths

        modules = dict(self.model.named_modules())
        return {**{path: modules[path] for path in layer_paths(modules)}, "loss": self.loss}

    # -- phases ---------------------------------------------------------------------
    def forward(self, *, grad: bool = True) -> torch.Tensor:
        with torch.set_grad_enabled(grad):
            self._loss = self._loss_of(self.inputs, self.targets)
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
        with torch.no_grad():
            return self._logits_of(self.inputs).cpu().numpy().copy()

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


class TorchCompileSession(TorchSession):
    """TorchSession with the loss (model + cross-entropy) and the logits under `torch.compile`.

    The forward phase runs the compiled graph of the loss; `loss.backward()` runs the
    backward graph AOTAutograd compiled with it, so both phases are Inductor's kernels and
    the timer still times them apart. `mode` is torch.compile's, from the backend's record
    (`Backend.compile_mode`): "default" is Inductor's default, "reduce-overhead" adds CUDA
    graphs (GPU only). Under CUDA graphs a graph's outputs live in memory the
    next replay overwrites: each step starts with `cudagraph_mark_step_begin`, and the
    loss handed out is a clone. Compilation happens at the first call of each graph (the
    first warm-up step)."""

    def __init__(self, config: ModelConfig, tokens: np.ndarray, *, device: str, dtype: str, seed: int,
                 weights: torch_impl.TransformerLM | None = None, optimizer: str = "fused",
                 mode: str = "default") -> None:
        super().__init__(config, tokens, device=device, dtype=dtype, seed=seed, weights=weights, optimizer=optimizer)
        self.cudagraphs = mode == "reduce-overhead"
        self._loss_of = torch.compile(self._loss_of, mode=mode)
        self._logits_of = torch.compile(self._logits_of, mode=mode)

    def forward(self, *, grad: bool = True) -> torch.Tensor:
        if self.cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        loss = super().forward(grad=grad)
        return loss.clone() if self.cudagraphs else loss

    def logits(self) -> np.ndarray:
        if self.cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        return super().logits()
