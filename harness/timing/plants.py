"""Planted imbalances for the layer-attribution tests, wrapped around a `ModelConfig` from
outside (the model files only ask `config.layer_d_ff(i)`)."""

from __future__ import annotations

import dataclasses

from harness.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class WideBlock(ModelConfig):
    """A model whose block `wide_layer` has an FFN of d_ff * wide_factor, the others d_ff."""

    wide_layer: int = 0
    wide_factor: int = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.wide_layer < self.num_layers:
            raise ValueError(f"wide_layer={self.wide_layer} must be a block index in [0, {self.num_layers})")
        if not isinstance(self.wide_factor, int) or self.wide_factor < 1:
            raise ValueError(f"wide_factor={self.wide_factor!r} must be a positive integer")

    def layer_d_ff(self, index: int) -> int:
        return self.d_ff * self.wide_factor if index == self.wide_layer else self.d_ff


def wide_block(config: ModelConfig, wide_layer: int | None, wide_factor: int = 8) -> ModelConfig:
    """`config` with block `wide_layer` widened `wide_factor` times; None leaves it as it is."""
    if wide_layer is None:
        return config
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(ModelConfig)}
    return WideBlock(**fields, wide_layer=wide_layer, wide_factor=wide_factor)
