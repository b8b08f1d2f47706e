"""Several training processes (``accelerate launch -m agentgym train``) and the update's loss normalisation.

One process per GPU (or CPU process with gloo), launched by ``accelerate``; what parallelism the
model gets (DDP, FSDP, DeepSpeed ZeRO) is accelerate's configuration (``accelerate config``), not
agentgym's. agentgym does three things itself:

- **Rollouts are split by task.** Each process collects its share of the iteration's tasks; the
  groups are gathered so every process holds the whole iteration (the estimator sees every group).
- **Rows are split, the loss is normalised globally.** Every minibatch is the same on every process
  (same seeded shuffle); process r trains on rows r, r+W, ... of it, cut into micro-batches of at
  most ``optim.micro_batch_tokens`` padded tokens. Each micro-batch's loss is weighted by its share
  of the whole minibatch's aggregation units (``Aggregation.weight`` in
  ``agentgym.training.engine.aggregation``: response tokens for ``token-mean``, rows for
  ``seq-mean-token-mean``/``seq-mean-token-sum``; ``seq-mean-token-sum-norm`` divides by a constant,
  so its micro-batch losses simply add up), so the sum over micro-batches and processes is exactly
  the loss of the minibatch computed in one piece: 2 processes give the same update as 1.
- **Only the main process writes** the run folder; every process reads checkpoints from it (a
  shared filesystem across nodes).

``Distributed.create`` returns a single-process stand-in when the run was not launched that way and
needs no mixed precision, so plain ``agentgym train`` needs no accelerate.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from agentgym.errors import ConfigError
from agentgym.rollout.collector import CollectStats
from agentgym.rollout.records import EpisodeGroup
from agentgym.training.run.interrupt import Region
from agentgym.training.run.pipeline import gather_groups

T = TypeVar("T")


class Distributed:
    """The processes of a run: rank, world size, and the collective operations the trainer uses.

    This base class is the single-process case (every operation is the identity); ``Accelerated``
    is the ``accelerate`` one.
    """

    rank: int = 0
    world_size: int = 1

    device: Any = None
    """This process's device under several processes (``cuda:LOCAL_RANK`` or cpu); None: the model's own."""

    @staticmethod
    def create(mixed_precision: str = "no", *, cpu: bool = False) -> Distributed:
        """``Accelerated`` when launched with several processes (``WORLD_SIZE`` > 1, as ``accelerate
        launch`` and ``torchrun`` set it) or when mixed precision is asked for; otherwise the
        single-process ``Distributed``. ``cpu`` (or no CUDA device) makes the processes CPU processes
        talking over gloo."""
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 or mixed_precision != "no":
            return Accelerated(mixed_precision, cpu=cpu)
        return Distributed()

    @property
    def is_main(self) -> bool:
        """The process that writes the run folder."""
        return self.rank == 0

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]:
        """Wrap the model and optimiser for training (DDP/FSDP/DeepSpeed under accelerate)."""
        return model, optimizer

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def no_sync(self, model: Any) -> contextlib.AbstractContextManager[None]:
        """Skip the gradient all-reduce of this backward (all but a step's last micro-batch)."""
        return contextlib.nullcontext()

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """Mixed precision for the training forward pass (a no-op without it)."""
        return contextlib.nullcontext()

    def clip_grad_norm(self, parameters: Any, max_norm: float) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm)

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """Element-wise sum over processes."""
        return values

    def gather_objects(self, items: list[Any]) -> list[list[Any]]:
        """Every process's ``items``, by rank."""
        return [items]

    def barrier(self) -> None:
        """Wait until every process gets here."""

    def shard(self, num: int) -> list[int]:
        """This process's share of ``num`` items: indices rank, rank + W, ..."""
        return list(range(self.rank, num, self.world_size))

    def gather_rows(self, local: torch.Tensor, num: int) -> torch.Tensor:
        """Reassemble a ``(num, ...)`` tensor from each process's ``shard(num)`` rows (``local``)."""
        return local

    def unwrap(self, model: Any) -> Any:
        return model

    def broadcast_parameters(self, model: torch.nn.Module) -> None:
        """Make every process's weights the main process's."""

    # What the loop asks of its processes, one call whatever their number (the base class: one process).

    share_tag: str = ""
    """Names this process's share in group ids (``p1-``) when several processes each collect a share."""

    def run_dir(self, root: Path) -> Path:
        """Where this process logs: the run folder, or (a process other than the main one) a scratch folder
        of its own, removed by ``release_run_dir``."""
        return root

    def release_run_dir(self, path: Path) -> None:
        """Remove ``run_dir``'s scratch folder (the run folder stays)."""

    def gather_groups(self, groups: list[EpisodeGroup], stats: CollectStats
                      ) -> tuple[list[EpisodeGroup], CollectStats]:
        """Every process's groups, in task order, and the summed statistics (``pipeline.gather_groups``)."""
        return groups, stats

    def on_main(self, write: Callable[..., Any], *args: Any) -> None:
        """``write(*args)`` in the main process only (the one that writes the run folder)."""
        if self.is_main:
            write(*args)

    def main_only(self, value: T) -> T | None:
        """``value`` in the main process, None in the others (trackers: only the main process logs)."""
        return value if self.is_main else None

    @property
    def update_region(self) -> Region | None:
        """How a stop may cut an update short (``StopSignals.region``): ``abandonable`` with one process; None
        (it runs to its end) under several, which would leave the collectives at different steps."""
        return "abandonable" if self.world_size == 1 else None

    def update_poll(self, poll: Callable[[], None]) -> Callable[[], None] | None:
        """The stop check the update may call between its steps: ``poll`` where a stop may cut it short."""
        return poll if self.update_region is not None else None


class Accelerated(Distributed):
    """``Distributed`` over ``accelerate.Accelerator`` (one process per device)."""

    def __init__(self, mixed_precision: str = "no", *, cpu: bool = False) -> None:
        try:
            from accelerate import Accelerator
        except ImportError:
            raise ConfigError("several processes or optim.mixed_precision need accelerate: "
                              "pip install 'agentgym-rl[accelerate]'") from None
        self.accelerator = Accelerator(mixed_precision=mixed_precision,
                                       cpu=cpu or not torch.cuda.is_available())
        self.rank = self.accelerator.process_index
        self.world_size = self.accelerator.num_processes
        self.device = self.accelerator.device if self.world_size > 1 else None
        self.share_tag = f"p{self.rank}-" if self.world_size > 1 else ""

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]:
        if self.world_size == 1:
            return model, optimizer
        return self.accelerator.prepare(model, optimizer)

    def backward(self, loss: torch.Tensor) -> None:
        self.accelerator.backward(loss)

    def no_sync(self, model: Any) -> contextlib.AbstractContextManager[None]:
        return self.accelerator.no_sync(model) if self.world_size > 1 else contextlib.nullcontext()

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        return self.accelerator.autocast()

    def clip_grad_norm(self, parameters: Any, max_norm: float) -> torch.Tensor:
        return self.accelerator.clip_grad_norm_(parameters, max_norm)

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return values
        return self.accelerator.reduce(values.to(self.accelerator.device), reduction="sum").cpu()

    def gather_objects(self, items: list[Any]) -> list[list[Any]]:
        if self.world_size == 1:
            return [items]
        gathered: list[Any] = [None] * self.world_size
        torch.distributed.all_gather_object(gathered, items)
        return gathered

    def barrier(self) -> None:
        self.accelerator.wait_for_everyone()

    def gather_rows(self, local: torch.Tensor, num: int) -> torch.Tensor:
        if self.world_size == 1:
            return local
        per_rank = -(-num // self.world_size)
        padded = torch.zeros((per_rank, *local.shape[1:]), dtype=local.dtype, device=self.accelerator.device)
        padded[: local.shape[0]] = local
        gathered = self.accelerator.gather(padded).cpu()
        everything = gathered.reshape(self.world_size, per_rank, *local.shape[1:])
        out = torch.empty((num, *local.shape[1:]), dtype=local.dtype)
        for rank in range(self.world_size):
            rows = list(range(rank, num, self.world_size))
            out[rows] = everything[rank, : len(rows)]
        return out

    def unwrap(self, model: Any) -> Any:
        return self.accelerator.unwrap_model(model)

    def run_dir(self, root: Path) -> Path:
        return root if self.is_main else Path(tempfile.mkdtemp(prefix=f"agentgym-rank{self.rank}-"))

    def release_run_dir(self, path: Path) -> None:
        if not self.is_main:
            shutil.rmtree(path, ignore_errors=True)

    def gather_groups(self, groups: list[EpisodeGroup], stats: CollectStats
                      ) -> tuple[list[EpisodeGroup], CollectStats]:
        return gather_groups(self, groups, stats) if self.world_size > 1 else (groups, stats)

    def broadcast_parameters(self, model: torch.nn.Module) -> None:
        if self.world_size == 1:
            return
        with torch.no_grad():
            for tensor in model.state_dict().values():
                torch.distributed.broadcast(tensor, src=0)
