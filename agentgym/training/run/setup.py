"""Set-up pieces of a training run: seeding, where envs come from, task sampling, turn order, LR schedule.

Pure functions of the config (and of collected groups), kept apart from the loop that calls them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import numpy as np
import torch

from agentgym.core import Env
from agentgym.errors import ConfigError
from agentgym.rollout.pool import EnvPool
from agentgym.rollout.records import EpisodeGroup, Turn
from agentgym.sources.env_source import EnvSource
from agentgym.sources.task_split import TaskRoute
from agentgym.training.config.coercion import to_plain
from agentgym.training.config.schema import TrainConfig
from agentgym.training.run.sampler_registry import TASK_SAMPLERS
from agentgym.training.run.task_sampling import TaskSampler, UniformSampler


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def env_urls(cfg: TrainConfig) -> list[str]:
    """The env services of the run: ``env.urls``, or ``[env.url]``, or none (in-process envs)."""
    return list(cfg.env.urls) or ([cfg.env.url] if cfg.env.url else [])


def env_source(cfg: TrainConfig) -> EnvSource:
    """The run's envs as an ``EnvSource``, the description `agentgym eval` builds its envs from too."""
    e = cfg.env
    harness = {"harness": e.harness, "tasks": e.tasks} if e.harness else {}
    judge = to_plain(e.judge) if e.judge is not None else None
    return EnvSource(e.id, {**dict(e.kwargs), **harness}, e.max_turns, tuple(env_urls(cfg)), e.token,
                     e.timeout_s, e.backend, e.ray_address, e.ray_workers, judge=judge,
                     routes=task_routes(cfg))


def task_routes(cfg: TrainConfig) -> tuple[TaskRoute, ...]:
    """How the run's seeds name tasks when it names splits (``env.train_split``, ``eval.split``): sampled
    seeds below ``eval.seed_offset`` are training task indices, held-out seeds from it held-out task
    indices, demonstration seeds from ``sft.seed_offset`` training task indices again (round when they
    outnumber the split). None named: no routes, seeds stay seeds."""
    train, held_out = cfg.env.train_split, cfg.eval.split
    if train is None and held_out is None:
        return ()
    return (TaskRoute(0, train), TaskRoute(cfg.eval.seed_offset, held_out),
            TaskRoute(cfg.sft.seed_offset, train, wrap=True))


def env_factory(cfg: TrainConfig) -> Callable[[], Env] | EnvPool:
    """Where the run's envs come from (``EnvSource.pool``); every answer is also a zero-argument env
    factory. With ``env.judge``, each env is wrapped in ``JudgedReward``, all sharing one judge (one cache,
    one bound on concurrent requests), as `agentgym eval` wraps them."""
    return env_source(cfg).pool()


def demo_env_factory(cfg: TrainConfig, pool: Callable[[], Env] | EnvPool) -> Callable[[], Env]:
    """Envs whose expert the run can ask, for its check and its SFT demonstrations
    (``EnvSource.demo_factory``): ``pool`` itself, except that envs in Ray actors offer no expert, so those
    are made in-process."""
    return env_source(cfg).demo_factory(pool)


def action_format(cfg: TrainConfig) -> str:
    """``rollout.action_format``, or the format the env's spec asks for, or ``plain``."""
    if cfg.rollout.action_format is not None:
        return cfg.rollout.action_format
    return env_source(cfg).action_format()


def task_seeds(cfg: TrainConfig, iteration: int, round_: int = 0) -> list[int]:
    """Uniform training task seeds of an iteration's collection round (``UniformSampler``): below
    ``eval.seed_offset``, so never an eval task."""
    return UniformSampler(cfg.seed, cfg.eval.seed_offset).sample(iteration, round_, cfg.rollout.num_tasks)


def split_sizes(cfg: TrainConfig, env: Env) -> tuple[int, int]:
    """How many training tasks the sampler draws from and how many held-out episodes an evaluation plays:
    ``eval.seed_offset`` and ``eval.num_episodes``, or fewer where ``env.train_split`` / ``eval.split``
    name finite splits of ``env`` (held-out: all of a split smaller than ``eval.num_episodes``).

    Raises:
        ConfigError: a named split is not one of the env's (the message lists them).
    """
    def size(key: str, split: str) -> int | None:
        try:
            return env.find_task_split(split, 0).size
        except ConfigError as exc:
            raise ConfigError(f"{key}: {exc} (`agentgym envs --tasks {cfg.env.id}` lists them)") from None

    train_tasks, held_out = cfg.eval.seed_offset, cfg.eval.num_episodes
    if cfg.env.train_split is not None:
        train_size = size("env.train_split", cfg.env.train_split)
        train_tasks = min(train_tasks, train_size) if train_size is not None else train_tasks
    if cfg.eval.split is not None:
        held_out_size = size("eval.split", cfg.eval.split)
        held_out = min(held_out, held_out_size) if held_out_size is not None else held_out
    return train_tasks, held_out


def task_sampler(cfg: TrainConfig, train_tasks: int | None = None) -> TaskSampler:
    """The run's task sampler, as ``rollout.task_sampler`` names it
    (``agentgym.training.run.task_sampling``), drawing below ``train_tasks`` (``split_sizes``; default
    ``eval.seed_offset``)."""
    limit = cfg.eval.seed_offset if train_tasks is None else train_tasks
    return TASK_SAMPLERS.get(cfg.rollout.task_sampler).build(cfg, limit)


def flatten(groups: list[EpisodeGroup]) -> list[Turn]:
    """Turns in estimator order: group → trajectory → turn."""
    return [turn for g in groups for t in g.trajectories for turn in t.turns]


def lr_schedule(cfg: TrainConfig) -> Callable[[int], float]:
    """The learning-rate factor per iteration: warm-up, then constant, cosine or linear decay."""
    def factor(step: int) -> float:
        warm = cfg.optim.warmup_iterations
        if warm and step < warm:
            return (step + 1) / warm
        progress = (step - warm) / max(1, cfg.iterations - warm)
        if cfg.optim.schedule == "cosine":
            return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
        if cfg.optim.schedule == "linear":
            return max(0.0, 1 - progress)
        return 1.0

    return factor
