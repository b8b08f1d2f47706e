"""Maze episodes collected by a scripted policy, with fork hooks: what test_fleet, test_workers and
test_ray_pool compare across env sources (in-process, a fleet of services, workers, Ray actors)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from scripted_policy import ScriptedPolicy

import agentgym
from agentgym.rollout.collector import Collector
from agentgym.rollout.hooks import Fork, RolloutHooks
from agentgym.rollout.policy import SamplingParams
from agentgym.rollout.prompt import PromptRenderer

MAZE = {"size": 3, "observation": "local"}
MAX_TURNS = 6
SEEDS = [11, 12, 13]
GROUP = 3
SAMPLING = SamplingParams(max_new_tokens=8, seed=4)


def local_envs() -> agentgym.Env:
    return agentgym.make("maze-v0", max_turns=MAX_TURNS, **MAZE)


def collect(make_env: Any, hooks: RolloutHooks | None = None) -> list[dict[str, Any]]:
    policy = ScriptedPolicy()
    renderer = PromptRenderer(policy.tokenizer, mode="window", window_turns=1, show_admissible_actions=False)
    collector = Collector(make_env, policy, renderer)
    try:
        return [g.to_json() for g in collector.collect(SEEDS, GROUP, SAMPLING, hooks=hooks)]
    finally:
        collector.close()


class ForkAndTopUp(RolloutHooks):
    """After turn 1, forks member t0 of every group and starts one fresh episode in group 0."""

    def before_collect(self, num_groups: int) -> None:
        self.done = False

    def after_turn(self, episodes, context):
        if self.done:
            return []
        self.done = True
        forks = [Fork(v.group_index, v.trajectory_id) for v in episodes
                 if v.trajectory_id.endswith("-t0") and not v.over]
        return forks + [Fork(0)]


class AtTurn(RolloutHooks):
    """Runs ``action()`` once after turn ``turn`` (kills a service mid-collection), then forks like
    ForkAndTopUp."""

    def __init__(self, turn: int, action: Callable[[], None]) -> None:
        self.turn, self.action, self.seen = turn, action, 0
        self.forks = ForkAndTopUp()

    def before_collect(self, num_groups: int) -> None:
        self.seen = 0
        self.forks.before_collect(num_groups)

    def after_turn(self, episodes, context):
        self.seen += 1
        if self.seen == self.turn:
            self.action()
        return self.forks.after_turn(episodes, context) if self.seen == 1 else []
