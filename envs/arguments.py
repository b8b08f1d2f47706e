"""Checks of env constructor arguments, with the ``ConfigError`` messages every built-in env uses."""

from __future__ import annotations

from typing import Any

import numpy as np

from agentgym.errors import ConfigError


def check_int(value: Any, name: str, low: int, high: int) -> None:
    """``value`` must be an integer (not a bool; numpy integers count) in ``[low, high]``.

    Example:
        >>> check_int(3, "top_k", 1, 20)
        >>> check_int(True, "top_k", 1, 20)
        Traceback (most recent call last):
        ...
        agentgym.errors.ConfigError: top_k must be an integer in [1, 20], got True
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
        raise ConfigError(f"{name} must be an integer in [{low}, {high}], got {value!r}")


def check_non_negative(value: Any, name: str) -> None:
    """``value`` must be a number (int or float, not a bool) ``>= 0``; NaN is refused.

    Example:
        >>> check_non_negative(0.1, "format_penalty")
        >>> check_non_negative(-1, "format_penalty")
        Traceback (most recent call last):
        ...
        agentgym.errors.ConfigError: format_penalty must be a number >= 0, got -1
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ConfigError(f"{name} must be a number >= 0, got {value!r}")
