"""Model configuration shared by the PyTorch and JAX implementations, and the vocabularies of
the options every tool shares (dtypes, modes, devices, optimizers, data-parallel strategies).

This is the only harness module that `torch_impl`, `jax_impl` and `pallas_kernels`
may import: both frameworks are built from the same frozen `ModelConfig`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

ATTENTION_CHOICES = ("naive", "fused", "pallas")
# The vocabularies of the options every tool shares (`harness.cli.dialect` offers them as choices).
DTYPES = ("fp32", "tf32", "bf16")
MODES = ("forward", "forward-backward", "train")
DEVICES = ("cuda", "cpu")
# The torch backends' AdamW: torch_impl.AdamW foreach, the same under torch.compile, the per-parameter loop.
OPTIMIZERS = ("foreach", "foreach-compiled", "fused", "loop")
# Data-parallel flavours: torch DDP or FSDP2; JAX parameters replicated or sharded to match.
PARALLEL = ("ddp", "fsdp", "zero1")
GRAD_COMM = ("fp32", "bf16")


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of the pre-norm Transformer LM (RoPE, SwiGLU, RMSNorm, untied head)."""

    name: str = "custom"
    vocab_size: int = 10_000
    d_model: int = 768
    d_ff: int = 3072
    num_layers: int = 12
    num_heads: int = 12
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5
    # "naive": explicit QK^T, masked softmax, PV (profiles show each kernel);
    # "fused": the framework's fused SDPA; "pallas": our Pallas kernel (JAX only).
    attention: str = "naive"

    def __post_init__(self) -> None:
        for field in ("vocab_size", "d_model", "d_ff", "num_layers", "num_heads"):
            value = getattr(self, field)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{field}={value!r} must be a positive integer")
        if self.d_model % self.num_heads:
            raise ValueError(
                f"d_model={self.d_model} must be divisible by num_heads={self.num_heads}"
            )
        if self.d_head % 2:
            raise ValueError(f"d_head={self.d_head} must be even for RoPE pairs")
        if self.attention not in ATTENTION_CHOICES:
            raise ValueError(
                f"unknown attention {self.attention!r}; choose one of {', '.join(ATTENTION_CHOICES)}"
            )

    @property
    def d_head(self) -> int:
        return self.d_model // self.num_heads

    def layer_d_ff(self, index: int) -> int:
        """The FFN width of block `index` (every block alike; `harness.timing.plants` varies it)."""
        return self.d_ff

    @property
    def num_params(self) -> int:
        """Parameter count: embedding + blocks + final norm + untied lm_head."""
        d = self.d_model
        blocks = sum(4 * d * d + 3 * d * self.layer_d_ff(i) + 2 * d for i in range(self.num_layers))
        return 2 * self.vocab_size * d + blocks + d


# d_model / d_ff / num_layers / num_heads. `tiny` and `mini` are CPU-sized (d_head 64,
# so the Pallas kernel accepts them); the rest are the published sizes.
PRESETS: dict[str, dict[str, int]] = {
    "tiny": dict(d_model=128, d_ff=512, num_layers=2, num_heads=2),
    "mini": dict(d_model=256, d_ff=1024, num_layers=4, num_heads=4),
    "small": dict(d_model=768, d_ff=3072, num_layers=12, num_heads=12),
    "medium": dict(d_model=1024, d_ff=4096, num_layers=24, num_heads=16),
    "large": dict(d_model=1280, d_ff=5120, num_layers=36, num_heads=20),
    "xl": dict(d_model=1600, d_ff=6400, num_layers=48, num_heads=25),
    "2.7B": dict(d_model=2560, d_ff=10240, num_layers=32, num_heads=32),
}


def config_from_document(saved: dict) -> tuple[ModelConfig, list[str]]:
    """The `ModelConfig` a result document saved (its `config`), and the names of the saved
    fields this version has no field for: a document written by an older or newer harness
    is read by the fields both know, and the caller says which it left out. Raises
    ValueError (TypeError for a field of the wrong kind) where the known fields make no
    valid config."""
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(saved) - fields)
    return ModelConfig(**{k: v for k, v in saved.items() if k in fields}), unknown


def get_config(name: str, **overrides) -> ModelConfig:
    """The preset `name`, with any field replaced by `overrides`."""
    if name not in PRESETS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(PRESETS)}")
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"unknown config field(s) {unknown}; valid fields: {', '.join(sorted(fields))}")
    return ModelConfig(name=name, **{**PRESETS[name], **overrides})

