"""Checkpoints for exact resume: model, optimiser, schedule, RNGs, counters, plug-in and sampler state."""

from __future__ import annotations

import random
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentgym.errors import ConfigError
from agentgym.run_folder import RunFolder
from agentgym.training.engine.weights import write_torch


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
    return write_torch({"rng": rng_state(), **state}, RunFolder(out_dir).checkpoint)


def checkpoint_iteration(out_dir: Path) -> int | None:
    """The iteration the checkpoint in ``out_dir`` ends (None without one); reads no tensor data."""
    path = RunFolder(out_dir).checkpoint
    if not path.is_file():
        return None
    return int(read_checkpoint(path, mmap=True, remedy=_restart(out_dir))["iteration"])


def read_checkpoint(path: str | Path, *, mmap: bool = False, remedy: str = "",
                    entry: str | None = "iteration") -> dict[str, Any]:
    """The state saved in the checkpoint file ``path`` (an ``agentgym train`` checkpoint), on the CPU.

    Args:
        path: the file.
        mmap: map the tensors instead of reading them (reading the counters only is then cheap).
        remedy: what the user can do about a damaged file, appended to the error.
        entry: the key the saved mapping must have (None: any mapping, as ``reference.pt``'s weights).

    Raises:
        ConfigError: the file is missing, empty, cut short, not a PyTorch checkpoint (a text file) or not
            a training checkpoint, in one line naming the file.
    """
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}"
                          + (f"; {remedy}" if remedy else "")) from None
    why = None
    if not head:
        why = "the file is empty"
    elif head == b"PK\x03\x04" and not zipfile.is_zipfile(path):
        why = "the file is cut short (a full disk, or a process killed while writing it)"
    elif head[:2] != b"PK":
        why = "it is not a PyTorch checkpoint (a text file, or another format)"
    if why is None:
        try:
            state = torch.load(path, mmap=mmap, map_location="cpu", weights_only=False)
        except Exception as exc:  # noqa: BLE001 - torch reports a damaged archive in several ways
            why = f"it cannot be read: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        else:
            if isinstance(state, dict) and (entry is None or entry in state):
                return state
            why = ("it holds no `agentgym train` state" + (f" (no {entry!r} entry)" if entry else ""))
    raise ConfigError(f"{path} is damaged: {why}" + (f"; {remedy}" if remedy else ""))


def _restart(out_dir: Path) -> str:
    return f"the run cannot resume from it. Start the run again with: {RunFolder(out_dir).restart_command()}"


def load_checkpoint(out_dir: Path) -> dict[str, Any]:
    """The state saved in ``out_dir``; RNG states are reinstated by the caller with ``set_rng_state``.

    Raises:
        ConfigError: there is no checkpoint in ``out_dir``, or it is damaged (saying how to start the run
            again).
    """
    folder = RunFolder(out_dir)
    if not folder.has_checkpoint():
        raise ConfigError(f"--resume {out_dir}: no {folder.checkpoint.name} there: the run stopped before "
                          f"its first checkpoint. Start it again with: {folder.restart_command()}")
    return read_checkpoint(folder.checkpoint, remedy=_restart(out_dir))
