"""``make_policy``: builds the generation backend a ``ModelConfig`` names (``register_backend`` adds more)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from agentgym.backends.config import ModelConfig
from agentgym.errors import ConfigError, UnknownPlugin
from agentgym.plugins import PluginRegistry
from agentgym.rollout.policy import Policy

BackendBuilder = Callable[[ModelConfig, int], Policy]
"""Contract of a backend builder: ``(model config, seed) -> Policy``; raises ``ConfigError`` for a
config it cannot serve (missing files, unavailable device) before allocating anything large."""

#: Built-ins register when ``agentgym.backends`` is imported (its modules call ``register_backend``).
_BACKENDS: PluginRegistry[BackendBuilder] = PluginRegistry("backend", "agentgym.backends",
                                                           field="model.backend", unknown_error=UnknownPlugin)


def register_backend(name: str, builder: BackendBuilder, *, override: bool = False) -> None:
    """Make ``model.backend: NAME`` build policies with ``builder``.

    Raises:
        RegistryError: ``name`` is empty, or taken by another builder and ``override`` is False.
    """
    _BACKENDS.register(name, builder, override=override)


def list_backends() -> list[str]:
    """Registered backend names, sorted."""
    return _BACKENDS.names()


def make_policy(cfg: ModelConfig, *, seed: int = 0) -> Policy:
    """Build the policy ``cfg`` describes.

    Args:
        cfg: which model, backend, dtype and device, and torch's CPU threads (``num_threads``: set for
            the whole process).
        seed: seeds the sampler and, for a tiny model, the weight initialisation.

    Raises:
        UnknownPlugin: ``cfg.backend`` is not registered (a ``RegistryError`` and a ``ConfigError``;
            the message suggests the nearest and lists all).
        ConfigError: unusable device or model path (one line, naming the field).

    Example:
        >>> from agentgym.backends.config import TinyModelConfig
        >>> policy = make_policy(ModelConfig(tiny=TinyModelConfig(num_layers=1), device="cpu"))
        >>> type(policy).__name__, policy.tokenizer.eos_token
        ('TransformersPolicy', '<|im_end|>')
    """
    builder = _BACKENDS.get(cfg.backend)
    if cfg.num_threads is not None:
        import torch

        torch.set_num_threads(cfg.num_threads)
    return builder(cfg, seed)


def resolve_device(name: str) -> Any:
    """The ``torch.device`` for ``model.device``, checked against the hardware present.

    Raises:
        ConfigError: a malformed name, or CUDA asked for where there is none (or not that index).
    """
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"model.device {name!r} is not a device name ({exc}); "
                          "use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"model.device is {name!r} but this machine has no usable CUDA device; "
                              "set model.device=cpu (or auto)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"model.device is {name!r} but only {torch.cuda.device_count()} CUDA device(s) "
                              f"exist; use cuda:0..cuda:{torch.cuda.device_count() - 1}")
    elif device.type not in ("cpu", "mps"):
        raise ConfigError(f"model.device {name!r}: device type {device.type!r} is not supported; "
                          "use auto, cpu or cuda")
    return device


def _transformers(cfg: ModelConfig, seed: int) -> Policy:
    import torch

    from agentgym.backends.tiny import load_model_and_tokenizer
    from agentgym.backends.transformers_backend import TransformersPolicy

    device = resolve_device(cfg.device)
    source: Any = replace(cfg.tiny, seed=seed)
    if cfg.path:
        from agentgym.backends.gguf import model_dir

        # A Hub id becomes its folder in the Hugging Face cache here, where model.revision is known; a
        # packaged model or a .gguf file, its converted folder. Every loader below reads local files only.
        source = str(model_dir(cfg.path, revision=cfg.revision))
        cfg = replace(cfg, path=source, revision=None)
    if cfg.lora is not None and cfg.lora.quantize is not None:
        from agentgym.backends.lora import load_quantized

        model, tokenizer = load_quantized(cfg, device)
    else:
        model, tokenizer = load_model_and_tokenizer(source, dtype=getattr(torch, cfg.dtype))
        model = model.to(device)
    if cfg.lora is not None:
        from agentgym.backends.lora import apply_lora

        torch.manual_seed(seed)  # the adapter's random half (lora_A) is part of the run's seeded state
        model = apply_lora(model, cfg.lora)
    if cfg.train_top_layers is not None:
        train_only_top_layers(model, cfg.train_top_layers)
    return TransformersPolicy(model, tokenizer, seed=seed, decode=cfg.decode)


@contextlib.contextmanager
def every_weight_trained(model: Any, when: bool = True) -> Iterator[None]:
    """Within the block every parameter of ``model`` requires a gradient (``sft.all_layers`` under
    ``model.train_top_layers``); on leaving it, each gets its own setting back. ``when=False`` changes
    nothing.

    Example:
        >>> import torch
        >>> model = torch.nn.Linear(2, 2).requires_grad_(False)
        >>> with every_weight_trained(model):
        ...     model.weight.requires_grad
        True
        >>> model.weight.requires_grad
        False
    """
    saved = [(param, param.requires_grad) for param in model.parameters()] if when else []
    try:
        if when:
            model.requires_grad_(True)
        yield
    finally:
        for param, flag in saved:
            param.requires_grad_(flag)


def train_only_top_layers(model: Any, count: int) -> None:
    """Leave ``requires_grad`` on the top ``count`` decoder layers, the final norm and an untied output head
    only. With the embeddings frozen nothing below those layers needs a gradient, so autograd's backward
    pass ends at the lowest of them.

    Raises:
        ConfigError: the model has no ``layers`` list in its decoder, or fewer than ``count`` layers.

    Example:
        >>> from agentgym.backends.tiny import load_model_and_tokenizer
        >>> from agentgym.backends.config import TinyModelConfig
        >>> model, _ = load_model_and_tokenizer(TinyModelConfig(num_layers=3))
        >>> train_only_top_layers(model, 1)
        >>> trained = [name for name, p in model.named_parameters() if p.requires_grad]
        >>> sorted({name.split(".")[2] for name in trained if ".layers." in name})
        ['2']
        >>> "model.norm.weight" in trained, "model.embed_tokens.weight" in trained
        (True, False)
    """
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ConfigError(f"model.train_top_layers needs a decoder with a list of layers; "
                          f"{type(model).__name__} has none: set model.train_top_layers=null")
    if count > len(layers):
        raise ConfigError(f"model.train_top_layers is {count} but the model has {len(layers)} layers; "
                          f"use 1..{len(layers)}")
    model.requires_grad_(False)
    for module in [*layers[len(layers) - count:], getattr(decoder, "norm", None)]:
        if module is not None:
            module.requires_grad_(True)
    head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    if head is not None and head.weight is not embeddings.weight:
        head.requires_grad_(True)


register_backend("transformers", _transformers)
