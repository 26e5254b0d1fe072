"""What the timer, the parity check and the data-parallel ranks ask of a backend's session."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class Session(Protocol):
    """Model, optimizer and one token batch on a device, with each phase of a training
    step as a method. A phase may return before the device is done; `sync` waits."""

    # -- phases ---------------------------------------------------------------------
    def forward(self, *, grad: bool = True) -> Any:
        """The loss of the batch (keeping what the backward needs when `grad`)."""

    def backward(self) -> Any:
        """Gradients of the last forward's loss."""

    def optimizer_step(self) -> Any:
        """One AdamW update from the gradients, which it then clears."""

    def zero_grad(self) -> None:
        """Drop gradients and anything a forward kept for a backward."""

    def plain_step(self) -> Any:
        """forward + backward + optimizer with no ranges and no synchronization; returns the loss."""

    def fused_step(self) -> Any:
        """The whole step as one program where the backend has one, else the plain step."""

    def sync(self, value: object = None) -> None:
        """Wait for the device's queued work (`value`: an output to wait for)."""

    def align(self) -> None:
        """Wait for the device, then for every process of a data-parallel run to get here
        (a barrier over the process group); for one process, `sync`. Optional: the timer
        calls `sync` for a session without it."""

    # -- memory ---------------------------------------------------------------------
    def reset_peak_memory(self) -> None: ...

    def peak_memory(self) -> int | None:
        """Peak bytes since the last reset, or None where the backend cannot tell."""

    # -- values for parity ----------------------------------------------------------
    def logits(self) -> np.ndarray: ...

    def loss_and_grads(self) -> tuple[float, dict[str, np.ndarray]]: ...

    def params(self) -> dict[str, np.ndarray]:
        """Every parameter as float32 numpy, by torch_impl's parameter name."""

    # -- environment ----------------------------------------------------------------
    def device_name(self) -> str | None:
        """The GPU's name, None on CPU."""

    def versions(self) -> dict:
        """The framework's versions for the result's environment record."""
