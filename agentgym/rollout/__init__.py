"""Rollout (torch-free): records, the ``Policy`` protocol, action parsing, prompts, the collector and its
actors, env pools, hooks, demos, evaluation episodes in chunks of tasks (``evaluation``) and what episode
groups scored (``summary``, ``success``).

Example:
    >>> from agentgym.rollout import Turn, Trajectory, EpisodeGroup
    >>> group = EpisodeGroup("g0", "task", 0, [Trajectory([Turn([1], [2], [-0.1], 1.0, "s")], "task", 0)])
    >>> group.trajectories[0].episode_return
    1.0
"""

from __future__ import annotations

from agentgym.rollout.actions import ACTION_FORMATS, ActionFormat, ParsedAction, parse_action
from agentgym.rollout.actors import Actor, ActorTurn, ExpertActor, RandomActor, TokenActor, TurnRequest
from agentgym.rollout.collector import Collector, CollectStats
from agentgym.rollout.constraints import (
    DecodingConstraint,
    TagSpans,
    list_constraints,
    make_constraint,
    register_constraint,
)
from agentgym.rollout.demos import collect_demos, format_action
from agentgym.rollout.hooks import CollectContext, EpisodeView, Fork, HookChain, RolloutHooks
from agentgym.rollout.policy import ChatTokenizer, Generation, Policy, SamplingParams, Scorer
from agentgym.rollout.pool import EnvPool, LocalEnvPool, PoolEnv
from agentgym.rollout.prompt import Conversation, PromptMode, PromptRenderer
from agentgym.rollout.records import EpisodeGroup, Trajectory, Turn

__all__ = [
    "ACTION_FORMATS", "ActionFormat", "Actor", "ActorTurn", "ChatTokenizer", "CollectContext", "CollectStats",
    "Collector", "Conversation", "DecodingConstraint", "EnvPool", "EpisodeGroup", "EpisodeView",
    "ExpertActor", "Fork", "Generation", "HookChain", "LocalEnvPool", "ParsedAction", "Policy", "PoolEnv",
    "PromptMode", "PromptRenderer", "RandomActor", "RolloutHooks", "SamplingParams", "Scorer", "TagSpans",
    "TokenActor", "Trajectory", "Turn", "TurnRequest", "collect_demos", "format_action", "list_constraints",
    "make_constraint", "parse_action", "register_constraint",
]
