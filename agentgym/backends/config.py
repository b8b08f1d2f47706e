"""Model configuration (torch-free): ``TinyModelConfig`` (a model built from a config alone) and ``ModelConfig``.

``ModelConfig`` says which policy to build — a local Hugging Face directory or a tiny model, on
which backend, dtype and device — and ``agentgym.backends.make_policy`` builds it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from agentgym.errors import ConfigError

ARCHS = ("llama", "qwen2")


@dataclass(frozen=True)
class TinyModelConfig:
    """Shape of a tiny causal LM built from scratch (no download).

    The defaults (about 0.4 M parameters) train on two CPU cores in minutes.

    Example:
        >>> TinyModelConfig(arch="qwen2", num_layers=4).num_layers
        4
        >>> TinyModelConfig(hidden_size=100, num_heads=3)
        Traceback (most recent call last):
        ...
        agentgym.errors.ConfigError: TinyModelConfig.hidden_size (100) must be divisible by num_heads (3)
    """

    arch: Literal["llama", "qwen2"] = "llama"
    """Architecture: ``"llama"`` (``LlamaForCausalLM``) or ``"qwen2"`` (``Qwen2ForCausalLM``, q/k/v biases)."""
    hidden_size: int = 128
    """Width of the residual stream."""
    num_layers: int = 2
    """Number of transformer blocks."""
    num_heads: int = 4
    """Attention heads; ``hidden_size`` must be divisible by it."""
    num_kv_heads: int = 2
    """Key/value heads (grouped-query attention); must divide ``num_heads``."""
    intermediate_size: int = 384
    """Width of the gated MLP."""
    max_position_embeddings: int = 2048
    """Longest sequence (prompt plus generation) the rotary embedding is configured for, in tokens."""
    tie_word_embeddings: bool = True
    """The output projection shares the input embedding matrix."""
    seed: int = 0
    """Seed of the weight initialisation; the same config gives the same weights."""

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ConfigError(f"TinyModelConfig.arch must be one of {list(ARCHS)}, got {self.arch!r}")
        for name in (
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "intermediate_size",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"TinyModelConfig.{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"TinyModelConfig.hidden_size ({self.hidden_size}) must be divisible by "
                f"num_heads ({self.num_heads})"
            )
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"TinyModelConfig.num_heads ({self.num_heads}) must be divisible by "
                f"num_kv_heads ({self.num_kv_heads})"
            )



@dataclass(frozen=True)
class ModelConfig:
    """Which policy model to build (``agentgym.backends.make_policy``).

    Example:
        >>> ModelConfig(tiny=TinyModelConfig(hidden_size=64)).tiny.hidden_size
        64
    """

    path: str | None = None
    """Local Hugging Face model directory (with a chat template); None builds the tiny model ``tiny``."""
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    """Shape of the tiny model built when ``path`` is None. In training, its ``seed`` is replaced by the
    run's ``seed`` so one number seeds the whole run."""
    backend: str = "transformers"
    """Generation backend (``agentgym.backends.list_backends()``): ``transformers`` runs the trained model
    itself on CPU or CUDA."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype."""
    device: str = "auto"
    """``auto`` (cuda when available, else cpu), ``cpu``, ``cuda``, ``cuda:1``..."""
