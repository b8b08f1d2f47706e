"""``Processes``: what the update needs of the run's training processes, and ``OneProcess``, the single one.

The update splits each minibatch's rows over the processes and normalises the loss over all of them; it
does not know how the processes were launched. The run's ``Distributed`` (``accelerate`` or one process)
keeps this contract; ``OneProcess`` is the update's stand-in when it is given none (a test, a benchmark).
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

import torch


class Processes(Protocol):
    """The collective operations of the processes that train one model together."""

    world_size: int
    """How many processes train (1: this one alone)."""

    def shard(self, num: int) -> list[int]:
        """This process's share of ``num`` rows (indices)."""

    def gather_rows(self, local: torch.Tensor, num: int) -> torch.Tensor:
        """A ``(num, ...)`` tensor reassembled from every process's ``shard(num)`` rows (``local``)."""

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """Mixed precision for the training forward pass (a no-op without it)."""

    def no_sync(self, model: Any) -> contextlib.AbstractContextManager[None]:
        """Skip the gradient all-reduce of this backward (all but a step's last micro-batch)."""

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate ``loss`` (gradients summed over the processes)."""

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """Element-wise sum over the processes."""

    def clip_grad_norm(self, parameters: Any, max_norm: float) -> torch.Tensor:
        """Clip the global gradient norm to ``max_norm``; returns the norm before clipping."""


class OneProcess:
    """A single training process: every collective operation is the identity.

    Example:
        >>> OneProcess().shard(3), OneProcess().world_size
        ([0, 1, 2], 1)
    """

    world_size: int = 1

    def shard(self, num: int) -> list[int]:
        return list(range(num))

    def gather_rows(self, local: torch.Tensor, num: int) -> torch.Tensor:
        return local

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def no_sync(self, model: Any) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        return values

    def clip_grad_norm(self, parameters: Any, max_norm: float) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm)
