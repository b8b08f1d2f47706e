"""Model configuration (torch-free): ``TinyModelConfig`` (a model built from a config alone) and
``ModelConfig``.

``ModelConfig`` says which policy to build — a Hugging Face model (a local directory or a Hub id) or a
tiny model, on which backend, dtype and device — and ``agentgym.backends.make_policy`` builds it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from agentgym.backends.hub import parse_hub_id
from agentgym.errors import ConfigError

ARCHS = ("llama", "qwen2")
DecodeMode = Literal["dynamic", "static", "compiled"]
DECODE_MODES: tuple[str, ...] = ("dynamic", "static", "compiled")


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
    """Architecture: ``"llama"`` (``LlamaForCausalLM``) or ``"qwen2"`` (``Qwen2ForCausalLM``, q/k/v
    biases)."""
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



LORA_QUANTIZE = ("4bit", "8bit")


@dataclass(frozen=True)
class LoraConfig:
    """Train a LoRA adapter (PEFT) instead of every weight; QLoRA when ``quantize`` is set.

    The frozen base weights stay shared: the KL reference is the same model with the adapter
    disabled (no second copy), checkpoints hold the adapter, and vLLM server mode hot-loads it.

    Example:
        >>> LoraConfig(r=16).alpha
        32.0
        >>> LoraConfig(r=0)
        Traceback (most recent call last):
        ...
        agentgym.errors.ConfigError: model.lora.r must be a positive integer, got 0
    """

    r: int = 16
    """Rank of the adapter matrices."""
    alpha: float | None = None
    """LoRA scaling numerator (the update is scaled by alpha / r); None uses 2 * r."""
    dropout: float = 0.0
    """Dropout on the adapter's input during training."""
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                       "down_proj")
    """Names (last path component) of the linear layers that get an adapter; Llama/Qwen2 names by
    default."""
    quantize: Literal["4bit", "8bit"] | None = None
    """QLoRA: load the frozen base weights quantized with bitsandbytes (CUDA and a model ``path`` only)."""

    def __post_init__(self) -> None:
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 1:
            raise ConfigError(f"model.lora.r must be a positive integer, got {self.r!r}")
        if self.alpha is None:
            object.__setattr__(self, "alpha", float(2 * self.r))
        elif not self.alpha > 0:
            raise ConfigError(f"model.lora.alpha must be > 0 (or null for 2 * r), got {self.alpha!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.lora.dropout must be in [0, 1), got {self.dropout!r}")
        if not self.target_modules or not all(isinstance(m, str) and m for m in self.target_modules):
            raise ConfigError(f"model.lora.target_modules must list layer names such as q_proj, got "
                              f"{list(self.target_modules)!r}")
        if self.quantize is not None and self.quantize not in LORA_QUANTIZE:
            raise ConfigError(f"model.lora.quantize must be one of {list(LORA_QUANTIZE)} or null, "
                              f"got {self.quantize!r}")


@dataclass(frozen=True)
class ModelConfig:
    """Which policy model to build (``agentgym.backends.make_policy``).

    Example:
        >>> ModelConfig(tiny=TinyModelConfig(hidden_size=64)).tiny.hidden_size
        64
    """

    path: str | None = None
    """The model: a local Hugging Face directory (with a chat template), a Hugging Face Hub id
    (``Qwen/Qwen2.5-0.5B-Instruct``, loaded through the Hugging Face cache: ``agentgym.backends.hub``), a
    ``.gguf`` file or a packaged model (``smollm2``); None builds the tiny model ``tiny``. An existing local
    path is always a path."""
    revision: str | None = None
    """Hub ids only: the branch, tag or commit hash to load (None: ``main``); ``path: org/name@rev`` says
    the same."""
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
    lora: LoraConfig | None = None
    """Train a LoRA adapter instead of the full model (``LoraConfig``; needs the ``lora`` extra); None
    trains every weight."""
    train_top_layers: int | None = None
    """Train only the top N decoder layers, the final norm, and the output head unless it is tied to the
    input embeddings: the backward pass stops at layer N from the top, so an update costs less
    (``python benchmarks/async_rollouts.py --modes sync2t --set model.train_top_layers=N``). None trains
    every weight. Not with ``lora``."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, about a third more compute)."""
    decode: DecodeMode = "dynamic"
    """How the ``transformers`` backend runs its decoding steps (``agentgym.backends.decode_steps``):
    ``dynamic`` (a growing cache, prompts' shared prefixes prefilled once, finished rows dropped; the fastest
    on a CPU), ``static`` (a preallocated cache, fixed shapes) or ``compiled`` (static, each step through
    ``torch.compile``: CUDA graphs on a GPU, where per-step overhead dominates a small model's decoding;
    the first batch of each shape compiles, tens of seconds). Tokens and log-probs agree across the three
    (``python benchmarks/decode_modes.py`` measures them)."""
    vllm: dict[str, Any] = field(default_factory=dict)
    """Settings of the ``vllm`` backends (``agentgym.backends.vllm_backend.VLLMSettings`` fields):
    e.g. ``{gpu_memory_utilization: 0.4, sleep: true}`` for ``vllm``, ``{url: http://host:8000/v1}``
    for ``vllm-server``."""
    num_threads: int | None = None
    """torch's CPU threads in this process (``torch.set_num_threads``), set when the policy is built;
    None leaves torch's default (one per core, or ``OMP_NUM_THREADS``). On a small CPU shared with other
    work (env services, a second run) one thread can beat two by a wide margin
    (``python benchmarks/threads.py``)."""

    def __post_init__(self) -> None:
        if self.revision is not None and (not isinstance(self.revision, str) or not self.revision.strip()):
            raise ConfigError(f"model.revision must be a branch, tag or commit hash of the Hub model in "
                              f"model.path, or null, got {self.revision!r}")
        if self.revision is not None and (self.path is None or parse_hub_id(self.path) is None):
            raise ConfigError(f"model.revision ({self.revision!r}) picks a version of a Hugging Face Hub "
                              f"model, but model.path ({self.path!r}) is not a Hub id (org/name): set "
                              "model.path to one, or remove model.revision")
        top = self.train_top_layers
        if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 1):
            raise ConfigError(f"model.train_top_layers must be a positive integer or null (train every "
                              f"weight), got {top!r}")
        if top is not None and self.lora is not None:
            raise ConfigError("model.train_top_layers and model.lora both choose what trains: set one of "
                              "them")
        if self.decode not in DECODE_MODES:
            raise ConfigError(f"model.decode must be one of {list(DECODE_MODES)}, got {self.decode!r}")
        threads = self.num_threads
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ConfigError(f"model.num_threads must be a positive integer or null (torch's default), "
                              f"got {threads!r}")
