"""Generation backends behind ``agentgym.rollout.policy.Policy``, and ``make_policy`` to build one from
config.

``TransformersPolicy`` runs any ``transformers`` causal LM on CPU or CUDA; ``tiny`` builds small
models from a config alone; ``openai_backend`` talks to OpenAI-compatible servers and
``openai_server`` is one (``agentgym serve-policy``); ``vllm_backend`` and ``vllm_server`` generate
with vLLM for training (in-process, or a ``vllm serve`` over HTTP). Importing this package does not
import torch: backends load on first use.
"""

from __future__ import annotations

from typing import Any

from agentgym.backends import (  # noqa: F401  (register vllm, vllm-server; import no vLLM)
    openai_backend,
    vllm_backend,
    vllm_server,
)
from agentgym.backends.builder import list_backends, make_policy, register_backend
from agentgym.backends.config import ModelConfig, TinyModelConfig

__all__ = ["ModelConfig", "TinyModelConfig", "TransformersPolicy", "list_backends", "make_policy",
           "register_backend"]


def __getattr__(name: str) -> Any:
    if name == "TransformersPolicy":
        from agentgym.backends.transformers_backend import TransformersPolicy

        return TransformersPolicy
    raise AttributeError(f"module 'agentgym.backends' has no attribute {name!r}")
