"""``make_policy``: builds the generation backend a ``ModelConfig`` names (``register_backend`` adds more)."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from agentgym.backends.config import ModelConfig
from agentgym.errors import ConfigError
from agentgym.rollout.policy import Policy

BackendBuilder = Callable[[ModelConfig, int], Policy]
"""Contract of a backend builder: ``(model config, seed) -> Policy``; raises ``ConfigError`` for a
config it cannot serve (missing files, unavailable device) before allocating anything large."""

_BACKENDS: dict[str, BackendBuilder] = {}


def register_backend(name: str, builder: BackendBuilder, *, override: bool = False) -> None:
    """Make ``model.backend: NAME`` build policies with ``builder``.

    Raises:
        ConfigError: ``name`` is taken and ``override`` is False.
    """
    if name in _BACKENDS and not override and _BACKENDS[name] is not builder:
        raise ConfigError(f"backend {name!r} is already registered; pass override=True to replace it")
    _BACKENDS[name] = builder


def list_backends() -> list[str]:
    """Registered backend names, sorted."""
    return sorted(_BACKENDS)


def make_policy(cfg: ModelConfig, *, seed: int = 0) -> Policy:
    """Build the policy ``cfg`` describes.

    Args:
        cfg: which model, backend, dtype and device.
        seed: seeds the sampler and, for a tiny model, the weight initialisation.

    Raises:
        ConfigError: unknown backend, unusable device or model path (one line, naming the field).

    Example:
        >>> from agentgym.backends.config import TinyModelConfig
        >>> policy = make_policy(ModelConfig(tiny=TinyModelConfig(num_layers=1), device="cpu"))
        >>> type(policy).__name__, policy.tokenizer.eos_token
        ('TransformersPolicy', '<|im_end|>')
    """
    builder = _BACKENDS.get(cfg.backend)
    if builder is None:
        close = difflib.get_close_matches(cfg.backend, list(_BACKENDS), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"model.backend {cfg.backend!r} is not a registered backend.{hint} "
                          f"Registered: {', '.join(list_backends())}")
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
        raise ConfigError(f"model.device {name!r} is not a device name ({exc}); use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"model.device is {name!r} but this machine has no usable CUDA device; "
                              "set model.device=cpu (or auto)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"model.device is {name!r} but only {torch.cuda.device_count()} CUDA device(s) exist; "
                              f"use cuda:0..cuda:{torch.cuda.device_count() - 1}")
    elif device.type not in ("cpu", "mps"):
        raise ConfigError(f"model.device {name!r}: device type {device.type!r} is not supported; use auto, cpu or cuda")
    return device


def _transformers(cfg: ModelConfig, seed: int) -> Policy:
    import torch

    from agentgym.backends.tiny import load_model_and_tokenizer
    from agentgym.backends.transformers_backend import TransformersPolicy

    device = resolve_device(cfg.device)
    source: Any = cfg.path if cfg.path else replace(cfg.tiny, seed=seed)
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
    return TransformersPolicy(model, tokenizer, seed=seed)


register_backend("transformers", _transformers)
