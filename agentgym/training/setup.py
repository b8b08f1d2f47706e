"""Set-up pieces of a training run: seeding, where envs come from, task seeds, turn order, LR schedule.

Pure functions of the config (and of collected groups), kept apart from the loop that calls them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import numpy as np
import torch

import agentgym
from agentgym.core import Env
from agentgym.rollout.pool import EnvPool
from agentgym.rollout.records import EpisodeGroup, Turn
from agentgym.training.config import TrainConfig
from agentgym.training.plan import TurnIndex


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def env_urls(cfg: TrainConfig) -> list[str]:
    """The env services of the run: ``env.urls``, or ``[env.url]``, or none (in-process envs)."""
    return list(cfg.env.urls) or ([cfg.env.url] if cfg.env.url else [])


def env_factory(cfg: TrainConfig) -> Callable[[], Env] | EnvPool:
    """Where the run's envs come from; every answer is also a zero-argument env factory.

    - ``env.url`` / ``env.urls``: an ``EnvFleet`` over those services (one batched request per
      service per turn; least-loaded placement; a dead service's episodes replayed on another);
    - ``env.backend: ray``: a ``RayEnvPool`` (envs inside Ray actors);
    - else in-process envs (``agentgym.make``).
    """
    e = cfg.env
    urls = env_urls(cfg)
    if urls:
        from agentgym.http.fleet import EnvFleet

        return EnvFleet(urls, e.id, kwargs=e.kwargs, max_turns=e.max_turns, token=e.token, timeout_s=e.timeout_s)
    if e.backend == "ray":
        from agentgym.rollout.ray_pool import RayEnvPool

        return RayEnvPool(e.id, kwargs=e.kwargs, max_turns=e.max_turns, num_workers=e.ray_workers,
                          address=e.ray_address)
    return lambda: agentgym.make(e.id, max_turns=e.max_turns, **e.kwargs)


def action_format(cfg: TrainConfig) -> str:
    """``rollout.action_format``, or the format the env's spec asks for, or ``plain``."""
    if cfg.rollout.action_format is not None:
        return cfg.rollout.action_format
    urls = env_urls(cfg)
    if urls:
        from agentgym.http.client import EnvClient

        with EnvClient(urls[0], token=cfg.env.token, timeout_s=cfg.env.timeout_s) as client:
            wanted = client.env_detail(cfg.env.id).get("action_format")
    else:
        wanted = getattr(agentgym.spec(cfg.env.id), "action_format", None)
    return wanted or "plain"


def task_seeds(cfg: TrainConfig, iteration: int, round_: int = 0) -> list[int]:
    """Training task seeds of an iteration's collection round: below ``eval.seed_offset``, so never an eval task."""
    rng = np.random.default_rng([cfg.seed, iteration] if round_ == 0 else [cfg.seed, iteration, round_])
    return [int(s) for s in rng.integers(0, cfg.eval.seed_offset, size=cfg.rollout.num_tasks)]


def flatten(groups: list[EpisodeGroup]) -> list[Turn]:
    """Turns in estimator order: group → trajectory → turn."""
    return [turn for g in groups for t in g.trajectories for turn in t.turns]


def turn_index(groups: list[EpisodeGroup]) -> TurnIndex:
    """Trajectory id, step and group of every turn, in estimator order (what update plans split on)."""
    ids, steps, group_of, shared = [], [], [], []
    for g_index, group in enumerate(groups):
        for trajectory in group.trajectories:
            n = len(trajectory.turns)
            ids += [trajectory.trajectory_id] * n
            steps += range(n)
            group_of += [g_index] * n
            shared += [k < (trajectory.fork_turn or 0) for k in range(n)]
    return TurnIndex(np.array(ids, dtype=object), np.array(steps, dtype=np.int64), np.array(group_of, dtype=np.int64),
                     np.array(shared, dtype=bool))


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
