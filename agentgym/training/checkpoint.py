"""Checkpoints for exact resume: model, optimiser, schedule, RNG states, counters and plug-in state."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentgym.errors import ConfigError

CHECKPOINT = "checkpoint.pt"


def rng_state() -> dict[str, Any]:
    """The Python, NumPy and torch (CPU) generator states."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    """Reinstate ``rng_state()``."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(out_dir: Path, state: dict[str, Any]) -> Path:
    """Write ``state`` (plus the RNG states) atomically: a temporary file, then a rename."""
    tmp = out_dir / (CHECKPOINT + ".tmp")
    torch.save({**state, "rng": rng_state()}, tmp)
    return tmp.replace(out_dir / CHECKPOINT)


def load_checkpoint(out_dir: Path) -> dict[str, Any]:
    """The state saved in ``out_dir``; RNG states are reinstated by the caller with ``set_rng_state``.

    Raises:
        ConfigError: there is no checkpoint in ``out_dir``.
    """
    path = out_dir / CHECKPOINT
    if not path.is_file():
        raise ConfigError(f"--resume {out_dir}: no {CHECKPOINT} there; was the run started with --out {out_dir}?")
    return torch.load(path, weights_only=False)
