"""Generation backends implementing ``agentgym.rollout.policy.Policy`` (each imports its ML framework lazily).

``transformers_backend.TransformersPolicy`` runs any ``transformers`` causal LM on CPU or CUDA.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TransformersPolicy"]


def __getattr__(name: str) -> Any:
    # Importing agentgym.backends must not import torch; the backend loads on first use.
    if name == "TransformersPolicy":
        from agentgym.backends.transformers_backend import TransformersPolicy

        return TransformersPolicy
    raise AttributeError(f"module 'agentgym.backends' has no attribute {name!r}")
