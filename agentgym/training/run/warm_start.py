"""A run's warm start: SFT on expert demonstrations (``sft``), or another run's (``sft.from_run``): SFT once,
then RL from it with as many algorithms as wanted.

A run's *warm start* is everything before its first RL iteration: the evaluation before SFT, the SFT on expert
demonstrations, the evaluation before RL, and the random state after them. While the run is at iteration 0 its
folder's checkpoint holds exactly that (``agentgym train CONFIG --out DIR --warm-start-only`` stops there). A
run with ``sft.from_run: DIR`` reads it instead of doing its own: the same weights, the same evaluations, the
same random state, so its RL goes exactly as DIR's run would have gone from there with this run's algorithm.

That holds only when both configs agree on everything the warm start reads. ``WarmStartSource.open`` compares
them, field by field, before anything is written, and names every field that differs; the fields that may
differ are those only RL reads (``RL_ONLY``).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym.backends.builder import every_weight_trained
from agentgym.backends.lora import is_lora
from agentgym.errors import ConfigError
from agentgym.rollout.demos import collect_demos
from agentgym.run_folder import RESUMABLE, RunFolder, flatten, under
from agentgym.training.config.schema import TrainConfig, config_to_dict
from agentgym.training.engine.update import sft_update
from agentgym.training.engine.weights import load_model_state, restore_reference_base, save_reference
from agentgym.training.run.checkpoint import read_checkpoint, set_rng_state

#: Config fields the warm start never reads (with everything below them): the algorithm and its loss, the
#: optimiser settings SFT does not take (``sft_update`` takes ``grad_clip``, ``response_logits`` and
#: ``share_prefixes``; ``mixed_precision`` sets how SFT computes too), the shape of the training rollouts
#: (the evaluations sample at ``eval.temperature`` with the prompt settings, which must agree), and what a
#: resumed run may change anyway (``run_folder.RESUMABLE``: where the run runs and how it is observed).
RL_ONLY = (
    "algorithm", "loss", "sft.from_run",
    "optim.lr", "optim.weight_decay", "optim.betas", "optim.schedule", "optim.warmup_iterations",
    "optim.num_epochs", "optim.num_minibatches", "optim.micro_batch_tokens", "optim.old_logprobs_from_update",
    "rollout.num_tasks", "rollout.group_size", "rollout.temperature", "rollout.max_staleness",
    "rollout.partial_rollouts", "rollout.weight_sync_timeout_s", "rollout.require_tool_calls",
    "rollout.task_sampler", "rollout.curriculum",
    *RESUMABLE,
)


def rl_only(path: str) -> bool:
    """Whether the flattened config field ``path`` is one the warm start never reads."""
    return under(path, RL_ONLY)


def warm_start_fields(config: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """The flattened fields of ``config`` (``config_to_dict`` form) that decide its warm start; fields an
    older config lacks read as in ``defaults``. Two runs with equal results have interchangeable warm starts.

    Example:
        >>> from agentgym.training.config.schema import TrainConfig, config_to_dict
        >>> defaults = config_to_dict(TrainConfig())
        >>> fields = warm_start_fields({"seed": 3, "optim": {"lr": 0.5}}, defaults)
        >>> fields["seed"], "optim.lr" in fields, fields["sft.lr"] == TrainConfig().sft.lr
        (3, False, True)
    """
    merged = {**flatten(defaults), **flatten(config)}
    return {path: value for path, value in sorted(merged.items()) if not rl_only(path)}


@dataclass(frozen=True)
class WarmStartSource:
    """The run folder a run takes its warm start from, checked against that run's config."""

    folder: RunFolder

    @classmethod
    def open(cls, source: str | Path, config: dict[str, Any], defaults: dict[str, Any], *,
             out_dir: str | Path) -> WarmStartSource:
        """``source`` checked to hold a warm start this run (``config``, going into ``out_dir``) can take.

        Raises:
            ConfigError: no run there, its checkpoint is past iteration 0 (or missing, or damaged), it is
                this run's own folder, or the configs differ in a field the warm start reads (all named).
        """
        folder = RunFolder(source)
        if folder.path.resolve() == Path(out_dir).resolve():
            raise ConfigError(f"sft.from_run is this run's own folder ({folder.path}): give the folder of an "
                              f"earlier run, or leave sft.from_run out")
        if not folder.config.is_file():
            raise ConfigError(f"sft.from_run: no run in {folder.path} (no config.json); make a warm start "
                              f"there with: agentgym train CONFIG --out {folder.path} --warm-start-only")
        theirs = warm_start_fields(folder.saved_config(), defaults)
        ours = warm_start_fields(config, defaults)
        differ = [path for path in sorted({*theirs, *ours}) if theirs.get(path) != ours.get(path)]
        if differ:
            shown = ", ".join(f"{path} ({theirs.get(path)!r} there, {ours.get(path)!r} here)"
                              for path in differ[:6])
            more = f" and {len(differ) - 6} more" if len(differ) > 6 else ""
            raise ConfigError(f"sft.from_run: the run in {folder.path} made its warm start with other "
                              f"settings than this run's: {shown}{more}. Set them as that run had them, or "
                              f"make a warm start with this config (--warm-start-only)")
        iteration = int(cls._read(folder, mmap=True)["iteration"])
        if iteration != 0:
            raise ConfigError(f"sft.from_run: the checkpoint in {folder.path} holds iteration {iteration}, "
                              f"not the warm start (iteration 0), which later checkpoints replace; make one "
                              f"that stays with: agentgym train CONFIG --out DIR --warm-start-only")
        return cls(folder)

    @staticmethod
    def _read(folder: RunFolder, *, mmap: bool = False) -> dict[str, Any]:
        if not folder.checkpoint.is_file():
            raise ConfigError(f"sft.from_run: {folder.path} holds no checkpoint (its run stopped before "
                              f"its warm start ended); make one with: agentgym train CONFIG --out "
                              f"{folder.path} --overwrite --warm-start-only")
        return read_checkpoint(folder.checkpoint, mmap=mmap,
                               remedy=f"make the warm start again with: agentgym train CONFIG --out "
                                      f"{folder.path} --overwrite --warm-start-only")

    def state(self) -> dict[str, Any]:
        """The warm start's checkpoint: ``model`` or ``adapter``, ``extra`` (its evaluations and SFT
        statistics) and ``rng``."""
        return self._read(self.folder)

    def lora_base(self) -> dict[str, Any] | None:
        """A LoRA run's post-SFT base weights (``reference.pt``'s ``lora_base``), when SFT changed them."""
        path = self.folder.reference
        return read_checkpoint(path, entry="lora_base") if path.is_file() else None

    def copy_reference(self, target: Path) -> None:
        """The LoRA base weights file, into this run's folder (a resumed run rebuilds its base from it)."""
        if self.folder.reference.is_file():
            shutil.copyfile(self.folder.reference, target)

    def run(self, trainer: Any) -> dict[str, Any]:
        """Make the source's warm start the trainer's: its weights (and a LoRA run's post-SFT base, copied to
        this run's reference file), its random state, and what the generator plays. Returns the warm start's
        results, saying where they came from."""
        state, parts = self.state(), trainer.parts
        model, dist = parts.model, parts.dist
        reference_file, needs_reference = trainer.checkpoints.reference_file, parts.plugins.needs_reference
        base = self.lora_base() if is_lora(model) else None
        if base is not None:  # SFT changed the base weights: this run's resume rebuilds them from the copy
            restore_reference_base(model, base)
            dist.on_main(self.copy_reference, reference_file)
        load_model_state(model, state)
        parts.collection.weights_loaded()
        save_reference(model, reference_file, sft_ran=False, needed=needs_reference, write=dist.is_main)
        dist.barrier()
        set_rng_state(state["rng"])
        return {**{k: v for k, v in state["extra"].items() if k != "elapsed_s"},
                "warm_start_from": str(self.folder.path)}


class OwnWarmStart:
    """A run's own warm start: the held-out evaluation before SFT (``eval.before_sft``), SFT on expert
    demonstrations when ``sft.enabled``, and the KL reference saved from the weights RL starts from."""

    def run(self, trainer: Any) -> dict[str, Any]:
        """The warm start of ``trainer`` (a ``Trainer``); returns its results."""
        cfg, parts = trainer.cfg, trainer.parts
        extra: dict[str, Any] = {"eval_before_sft": (trainer.evaluate_phase("before", "eval before SFT")
                                                      if cfg.sft.enabled and cfg.eval.before_sft else None)}
        if cfg.sft.enabled:
            extra["sft"] = sft(cfg, parts, trainer.progress, trainer.poll_stop)
            parts.dist.broadcast_parameters(parts.model)  # every process goes on from the main one's weights
            parts.collection.weights_loaded()
        save_reference(parts.model, trainer.checkpoints.reference_file, sft_ran=cfg.sft.enabled,
                       needed=parts.plugins.needs_reference, write=parts.dist.is_main)
        parts.dist.barrier()
        return extra


def open_warm_start(cfg: TrainConfig, out_dir: Path) -> WarmStartSource | OwnWarmStart:
    """The run's warm start: ``sft.from_run``'s (checked against ``cfg`` now: ``WarmStartSource.open``), or
    its own."""
    if not cfg.sft.from_run:
        return OwnWarmStart()
    return WarmStartSource.open(cfg.sft.from_run, config_to_dict(cfg), config_to_dict(TrainConfig()),
                                out_dir=out_dir)


def sft(cfg: TrainConfig, parts: Any, progress: Any, poll: Callable[[], None]) -> dict[str, Any]:
    """SFT of ``parts.model`` (a ``RunParts``) on ``sft.num_episodes`` expert demonstrations, shown on
    ``progress``; ``poll`` is asked between steps whether to stop. Returns the demonstrations' statistics
    and SFT's."""
    s = cfg.sft
    demo_seeds = [s.seed_offset + i for i in range(s.num_episodes)]
    progress.start(f"expert demos ({s.num_episodes} episodes)")
    demos, demo_stats = collect_demos(parts.demo_envs, parts.renderer, demo_seeds,
                                      action_format=parts.collector.action_format)
    progress.finish(f"{len(demos)} turns")
    progress.start("SFT")
    with every_weight_trained(parts.model, s.all_layers and bool(cfg.model.train_top_layers)):
        stats = {**demo_stats, **sft_update(
            parts.model, demos, s, max_length=parts.max_length, pad_token_id=parts.pad_token_id,
            grad_clip=cfg.optim.grad_clip, seed=cfg.seed,
            on_step=lambda step, total, loss: progress.update(step, f"loss {loss:.3f}", total),
            poll=poll, response_logits=cfg.optim.response_logits, share_prefixes=cfg.optim.share_prefixes)}
    progress.finish()
    return stats
