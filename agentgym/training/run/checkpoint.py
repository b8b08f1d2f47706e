"""Checkpoints for exact resume (model, optimiser, schedule, RNGs, counters, plug-in and sampler state):
``Checkpoints`` saves them, resumes from one and keeps the point a stop resumes from."""

from __future__ import annotations

import copy
import random
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentgym.backends.lora import is_lora
from agentgym.errors import ConfigError
from agentgym.run_folder import RunFolder
from agentgym.training.config.schema import TrainConfig, config_to_dict
from agentgym.training.engine.weights import (
    load_model_state,
    model_state,
    restore_reference_base,
    write_torch,
)
from agentgym.training.run.setup import lr_schedule


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


@dataclass
class ResumePoint:
    """A point the run can be resumed from if it stops now: the end of ``iteration``. The live model,
    optimiser and schedule are that point's until the next update starts; what else changes meanwhile
    (RNG states, plug-in state) is captured here."""

    iteration: int
    """Iterations completed (0: right after the warm start)."""
    history: list[dict[str, Any]]
    """Their metrics."""
    rng: dict[str, Any] | None = None
    """RNG states at that point; None when that point's checkpoint is already saved."""
    plugins: dict[str, Any] | None = None
    """Plug-in state at that point (with ``rng``)."""
    abandoned: int | None = None
    """The iteration a stop at this point abandons, when it is not ``iteration + 1``."""


class Checkpoints:
    """A run's checkpoints: saving them, resuming from one, and the point a stop now would resume from.

    A checkpoint holds the model, optimiser, schedule, RNG states, plug-in and task-sampler state, the
    metrics so far, the warm start's results (``extra``) and what the collection had gathered ahead. Between
    checkpoints ``point`` follows the run: the end of the last iteration until the next update makes its
    first step, then the last checkpoint (``stopped_now`` saves the former, or names the latter).

    Args:
        cfg: the run's config (checked against the folder's on resume; its schedule).
        root: the run folder (written by the main process only).
        parts: the model, optimiser, schedule and stateful plug-ins saved.
        collection: what it collected ahead is saved with each checkpoint.
    """

    def __init__(self, cfg: TrainConfig, root: Path, parts: Any, collection: Any) -> None:
        self.cfg, self.root, self.parts, self.collection = cfg, Path(root), parts, collection
        self.folder = RunFolder(self.root)
        self.saved_iteration: int | None = None
        self.point: ResumePoint | None = None
        self.extra: dict[str, Any] | None = None
        """The warm start's results, saved with every checkpoint (None before the run starts)."""
        self.stop_after: int | None = None
        self.started = time.perf_counter()
        """When this sitting of the run started (``elapsed_s`` adds the time since)."""

    def plugin_state(self) -> dict[str, Any]:
        """State of the run's stateful plug-ins (hooks, plan, loss terms) and task sampler."""
        plugins = self.parts.plugins
        return {"hooks": plugins.hooks.state_dict(), "plan": plugins.plan.state_dict(),
                "terms": {name: term.state_dict() for name, term in plugins.terms.items()},
                "task_sampler": self.parts.task_sampler.state_dict()}

    def load_plugin_state(self, state: dict[str, Any]) -> None:
        plugins = self.parts.plugins
        plugins.hooks.load_state_dict(state.get("hooks", {}))
        plugins.plan.load_state_dict(state.get("plan", {}))
        for name, term in plugins.terms.items():
            term.load_state_dict(state.get("terms", {}).get(name, {}))
        self.parts.task_sampler.load_state_dict(state.get("task_sampler", {}))

    @staticmethod
    def check_folder(cfg: TrainConfig, out_dir: str | Path, *, resume: bool, overwrite: bool) -> None:
        """Whether ``out_dir`` can take the run, before anything is built: a run to resume (its config
        checked against ``cfg``), or a new or empty folder (``overwrite``: one to clear).

        Raises:
            ConfigError: it cannot, saying why and what to do.
        """
        folder = RunFolder(out_dir)
        if resume:
            folder.check_resume(config_to_dict(cfg), checkpoint_iteration(folder.path),
                                defaults=config_to_dict(TrainConfig()))
        else:
            folder.check_new(overwrite=overwrite)

    def start(self, iteration: int, history: list[dict[str, Any]], extra: dict[str, Any], *,
              stop_after: int | None = None) -> None:
        """The run starts RL at the end of ``iteration`` (saved already), with the warm start's ``extra``;
        ``stop_after``: the iteration to stop after, unfinished (None: none)."""
        self.point, self.extra, self.stop_after = ResumePoint(iteration, list(history)), extra, stop_after

    def stops_after_warm_start(self, iteration: int) -> bool:
        """The run was asked to stop right after its warm start (``--warm-start-only``), which it just did:
        ``sft.from_run`` reads that checkpoint."""
        return self.stop_after == 0 and iteration == 0

    def end_iteration(self, iteration: int, history: list[dict[str, Any]], stop_requested: bool) -> bool:
        """``iteration`` has run: saved when a checkpoint is due (every ``checkpoint_every`` iterations, the
        last one, and where the run stops). Returns whether it stops here (asked to, or ``stop_after``)."""
        stopping = stop_requested or (self.stop_after is not None and iteration >= self.stop_after)
        every = self.cfg.checkpoint_every
        if (every and iteration % every == 0) or iteration == self.cfg.iterations or stopping:
            self.save(iteration, history)
        return stopping

    def save(self, iteration: int, history: list[dict[str, Any]], extra: dict[str, Any] | None = None, *,
             rng: dict[str, Any] | None = None, plugins: dict[str, Any] | None = None) -> None:
        """Checkpoint the end of ``iteration`` (RNG and plug-in state: now, unless given)."""
        extra = self.extra if extra is None else extra
        self.extra = extra
        p = self.parts
        pending = self.collection.pending_state()  # asynchronous: the next iterations' episodes
        state = {"iteration": iteration, **model_state(p.model), "optimizer": p.optimizer.state_dict(),
                 "pending_rollout": pending,
                 "scheduler": p.scheduler.state_dict(), "plugins": plugins or self.plugin_state(),
                 "history": history,
                 "extra": {**extra,
                           "elapsed_s": extra.get("elapsed_s", 0.0) + time.perf_counter() - self.started}}
        p.dist.on_main(save_checkpoint, self.root, state if rng is None else {**state, "rng": rng})
        p.dist.barrier()
        self.saved_iteration = iteration

    def capture(self, iteration: int, history: list[dict[str, Any]]) -> ResumePoint:
        """The resume point at the end of ``iteration`` (call before the next update starts)."""
        if self.saved_iteration == iteration:
            return ResumePoint(iteration, list(history))
        return ResumePoint(iteration, list(history), rng_state(), copy.deepcopy(self.plugin_state()))

    def saved_point(self, history: list[dict[str, Any]]) -> ResumePoint | None:
        """The resume point of the last checkpoint (None without one)."""
        if self.saved_iteration is None:
            return None
        return ResumePoint(self.saved_iteration,
                           [h for h in history if h["iteration"] <= self.saved_iteration])

    def before_collect(self, iteration: int, history: list[dict[str, Any]]) -> None:
        """Iteration ``iteration`` starts: a stop resumes from the end of the last one. When collections of
        later iterations are under way (asynchronous, ``max_staleness`` > 1), from the last checkpoint
        instead of waiting for them."""
        self.point = self.saved_point(history)  # a background collection may be half done
        if not self.collection.ahead_of(iteration):
            self.collection.wait()  # a background collection must not change plug-in state while captured
            self.point = self.capture(iteration - 1, history)

    def update_stopped(self, iteration: int, history: list[dict[str, Any]]) -> None:
        """A stop cut ``iteration``'s update short after its first optimiser step: only the last checkpoint
        is left to resume from."""
        self.point = self.saved_point(history)
        if self.point is not None and self.point.iteration < iteration - 1:
            self.point.abandoned = iteration

    def updated(self) -> None:
        """The update changed the model: no resume point until the iteration is saved or the next starts."""
        self.point = None

    def finished(self, history: list[dict[str, Any]]) -> None:
        """Every iteration ran (the last one is saved)."""
        self.point = ResumePoint(self.cfg.iterations, history)

    def resume(self) -> tuple[list[dict[str, Any]], dict[str, Any], int]:
        """Reinstate the folder's checkpoint, after checking the config against the run's (the changes a
        resumed run may make are recorded). Returns the history, the warm start's results and the
        iteration."""
        cfg, p = self.cfg, self.parts
        changes = self.folder.check_resume(config_to_dict(cfg), checkpoint_iteration(self.root),
                                           defaults=config_to_dict(TrainConfig()))
        state = load_checkpoint(self.root)
        iteration = state["iteration"]
        p.dist.on_main(self.folder.record_changes, iteration, changes, config_to_dict(cfg))
        if is_lora(p.model) and self.reference_file.is_file():  # SFT changed the LoRA run's base
            restore_reference_base(p.model, self.read_reference(entry="lora_base"))
        load_model_state(p.model, state)
        p.optimizer.load_state_dict(state["optimizer"])
        p.scheduler.load_state_dict(state["scheduler"])
        # A longer run stretches the schedule: the next update already uses the new schedule's rate.
        factor = lr_schedule(cfg)(p.scheduler.last_epoch)
        for group, base_lr in zip(p.optimizer.param_groups, p.scheduler.base_lrs, strict=True):
            group["lr"] = base_lr * factor
        self.load_plugin_state(state.get("plugins", {}))
        self.collection.restore(iteration, state.get("pending_rollout"))
        set_rng_state(state["rng"])
        self.saved_iteration = iteration
        return state["history"], state["extra"], iteration

    @property
    def reference_file(self) -> Path:
        """``reference.pt``: every process rebuilds the KL reference from it."""
        return self.folder.reference

    def read_reference(self, entry: str | None) -> dict[str, Any]:
        """``reference.pt``, checked (a damaged or missing file is one line saying how to go on)."""
        return read_checkpoint(self.reference_file, entry=entry,
                               remedy=f"it holds the post-SFT weights the run's KL term compares with, so "
                                      f"the run cannot go on without it. Start it again with: "
                                      f"{self.folder.restart_command()}")

    @staticmethod
    def stopped(iteration: int | None, history: list[dict[str, Any]], signal: str | None, *,
                abandoned: int | None = None) -> dict[str, Any]:
        """What a run returns when it stops early (a signal, or ``stop_after``) after ``iteration`` (None:
        before anything was saved); ``abandoned``: the iteration cut short, when it is not ``iteration + 1``
        (iterations finished after the last checkpoint are redone on resume)."""
        return {"stopped_after": iteration, "signal": signal, "checkpoint": iteration is not None,
                "history": history, "abandoned": abandoned}

    def stopped_now(self, signal: str | None) -> dict[str, Any]:
        """The run was cut short (``StopNow``): save its resume point, if it has one not yet saved."""
        point = self.point
        if point is None:
            return self.stopped(None, [], signal)
        self.collection.abandon()  # a collection ahead of the point saved is not part of it
        if point.rng is not None and self.extra is not None:
            self.save(point.iteration, point.history, rng=point.rng, plugins=point.plugins)
        return self.stopped(point.iteration, point.history, signal, abandoned=point.abandoned)
