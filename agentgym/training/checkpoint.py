"""Checkpoints for exact resume: model, optimiser, schedule, RNG states, counters and plug-in state."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentgym.errors import ConfigError
from agentgym.training.run_folder import CHECKPOINT, RunFolder


def rng_state() -> dict[str, Any]:
    """The Python, NumPy and torch (CPU) generator states."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    """Reinstate ``rng_state()``."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(out_dir: Path, state: dict[str, Any]) -> Path:
    """Write ``state`` atomically (a temporary file, then a rename), with the RNG states as they are now
    unless ``state["rng"]`` gives the ones to save (captured earlier, at the point saved)."""
    tmp = out_dir / (CHECKPOINT + ".tmp")
    torch.save({"rng": rng_state(), **state}, tmp)
    return tmp.replace(out_dir / CHECKPOINT)


def checkpoint_iteration(out_dir: Path) -> int | None:
    """The iteration the checkpoint in ``out_dir`` ends (None without one); reads no tensor data."""
    path = out_dir / CHECKPOINT
    if not path.is_file():
        return None
    return int(torch.load(path, mmap=True, map_location="cpu", weights_only=False)["iteration"])


def load_checkpoint(out_dir: Path) -> dict[str, Any]:
    """The state saved in ``out_dir``; RNG states are reinstated by the caller with ``set_rng_state``.

    Raises:
        ConfigError: there is no checkpoint in ``out_dir`` (saying how to start the run again).
    """
    path = out_dir / CHECKPOINT
    if not path.is_file():
        raise ConfigError(f"--resume {out_dir}: no {CHECKPOINT} there: the run stopped before its first "
                          f"checkpoint. Start it again with: {RunFolder(out_dir).restart_command()}")
    return torch.load(path, weights_only=False)
