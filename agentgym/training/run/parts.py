"""``RunParts``: what a training run is made of, built once from its config before anything is written.

The processes, the policy and what generates for it, where envs come from, the algorithm's plug-ins, the
task sampler, the collector and one iteration's collection rounds, the optimiser, schedule and update step.
The loop (``agentgym.training.run.loop``) only calls them; the modes (synchronous or asynchronous
collection, one process or several) are objects among them, chosen here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from agentgym.backends.builder import make_policy
from agentgym.backends.transformers_backend import enable_activation_checkpointing
from agentgym.core import Env
from agentgym.errors import ConfigError
from agentgym.rollout.collector import Collector
from agentgym.rollout.prompt import PromptRenderer
from agentgym.training.api.plugin_set import PluginSet
from agentgym.training.api.terms import RunContext
from agentgym.training.config.schema import TrainConfig
from agentgym.training.engine.update import PolicyUpdate
from agentgym.training.engine.weights import trainable_parameters
from agentgym.training.run.collection import Collection, TaskRounds, make_collection
from agentgym.training.run.distributed import Distributed
from agentgym.training.run.setup import (
    action_format,
    demo_env_factory,
    env_factory,
    lr_schedule,
    seed_everything,
    split_sizes,
    task_sampler,
)
from agentgym.training.run.task_sampling import TaskSampler
from agentgym.training.run.weight_sync import InFlightWeights, rollout_generator


@dataclass
class RunParts:
    """A run's parts (``build`` makes them from the config)."""

    dist: Distributed
    """The run's processes."""
    plugins: PluginSet
    """The algorithm's plug-ins (estimator, hooks, plan, loss, terms)."""
    policy: Any
    """The policy being trained (its ``model`` and ``tokenizer``)."""
    generator: Any
    """What generates rollouts: the policy, or (asynchronous) a copy with weights of its own."""
    weights: InFlightWeights | None
    """The generator's own weights (asynchronous only)."""
    renderer: PromptRenderer
    make_env: Callable[[], Env]
    """Where the run's envs come from."""
    demo_envs: Callable[[], Env]
    """Envs whose expert the run can ask (SFT demonstrations)."""
    has_tools: bool
    train_tasks: int
    """How many training tasks the sampler draws from."""
    held_out_episodes: int
    """How many episodes a held-out evaluation plays."""
    task_sampler: TaskSampler
    collector: Collector
    rounds: TaskRounds
    """One iteration's collection."""
    collection: Collection
    """Synchronous or asynchronous collection."""
    optimizer: Any
    scheduler: Any
    update: PolicyUpdate
    pad_token_id: int
    max_length: int
    """Prompt plus response tokens."""

    @property
    def model(self) -> torch.nn.Module:
        return self.policy.model

    @property
    def tokenizer(self) -> Any:
        return self.policy.tokenizer

    @classmethod
    def build(cls, cfg: TrainConfig, dist: Distributed, poll: Callable[[], None]) -> RunParts:
        """Build every part of the run from ``cfg``, checking first what can fail (the env, the algorithm's
        needs, SFT's expert).

        Args:
            cfg: the validated config.
            dist: the run's processes.
            poll: the stop check long phases call between their steps (``StopSignals.poll``).

        Raises:
            ConfigError: the env, the backend or the config cannot give what the run needs.
        """
        plugins = PluginSet.from_config(cfg)
        for term in plugins.terms.values():
            term.begin_run(RunContext(iterations=cfg.iterations))
        seed_everything(cfg.seed)
        model_cfg = cfg.model if dist.device is None else replace(cfg.model, device=str(dist.device))
        policy = make_policy(model_cfg, seed=cfg.seed)  # several processes: each on its own device
        r, fmt = cfg.rollout, action_format(cfg)
        renderer = r.renderer(policy.tokenizer, fmt)  # type: ignore[arg-type]
        make_env = env_factory(cfg)
        demo_envs = demo_env_factory(cfg, make_env)
        train_tasks, held_out, has_tools = check_env(cfg, demo_envs, plugins, policy)
        sampler = task_sampler(cfg, train_tasks)
        generator, weights = rollout_generator(policy, policy.model, r, seed=cfg.seed,
                                               world_size=dist.world_size)
        collector = Collector(make_env, generator, renderer, action_format=fmt,
                              max_prompt_tokens=r.max_prompt_tokens)
        # Long phases ask before each of their steps whether to stop: the collector before every turn (in a
        # background thread too), the update between its chunks and minibatches.
        collector.stop_check = poll
        rounds = TaskRounds(collector, sampler, plugins, dist, r, cfg.seed)
        collection = make_collection(rounds, r, cfg.iterations, policy, generator, weights, dist)
        if cfg.model.gradient_checkpointing:
            enable_activation_checkpointing(policy.model)
        o = cfg.optim
        optimizer = torch.optim.AdamW(trainable_parameters(policy.model), lr=o.lr, betas=o.betas,
                                      weight_decay=o.weight_decay)
        trained, optimizer = dist.prepare(policy.model, optimizer)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_schedule(cfg))
        pad = policy.tokenizer.pad_token_id
        pad_token_id = pad if pad is not None else 0
        max_length = r.max_prompt_tokens + r.max_new_tokens
        update = PolicyUpdate(trained, optimizer, plugins, cfg.loss, o, temperature=r.temperature,
                              max_length=max_length, pad_token_id=pad_token_id, seed=cfg.seed,
                              drop_zero_advantage_turns=cfg.algorithm.drop_zero_advantage_turns, dist=dist,
                              micro_batch_tokens=o.micro_batch_tokens, response_logits=o.response_logits,
                              share_prefixes=o.share_prefixes, tis_cap=cfg.loss.tis_cap,
                              poll=dist.update_poll(poll))
        return cls(dist, plugins, policy, generator, weights, renderer, make_env, demo_envs, has_tools,
                   train_tasks, held_out, sampler, collector, rounds, collection, optimizer, scheduler,
                   update, pad_token_id, max_length)

    def close(self) -> None:
        self.collection.close()
        self.collector.close()
        if callable(getattr(self.policy, "close", None)):
            self.policy.close()


def check_env(cfg: TrainConfig, demo_envs: Callable[[], Env], plugins: PluginSet, policy: Any
              ) -> tuple[int, int, bool]:
    """Reset one env before anything else: a bad env id or argument fails here, and so does an algorithm
    whose needs the env or backend cannot meet. Returns the training tasks, the held-out episodes
    (``split_sizes``) and whether the env has tools."""
    env = demo_envs()
    try:
        # How many tasks the named splits hold (before a reset, whose error would not name the key).
        train_tasks, held_out = split_sizes(cfg, env)
        _, info = env.reset(seed=cfg.eval.seed_offset)
        has_expert = bool(getattr(env, "has_expert", False))
    finally:
        env.close()
    if cfg.sft.enabled and not has_expert:
        raise ConfigError(f"sft.enabled needs expert demonstrations, but {cfg.env.id!r} has no "
                          "expert (an env declares one by defining expert_action()); set "
                          "sft.enabled=false to start RL from the untrained policy")
    plugins.check_needs(policy, cfg.env.id, info)
    return train_tasks, held_out, bool(info.get("tools"))
