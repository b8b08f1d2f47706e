"""Evaluation episodes of a token-level policy through the ``Collector`` (batched generation across
live episodes): ``collect_episodes`` (what training's held-out evaluations and ``agentgym eval`` both
call) and ``InfoRecorder`` (keeps each episode's observations and infos for the trajectory log).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from agentgym.core import Env
from agentgym.rollout.collector import Collector
from agentgym.rollout.policy import SamplingParams
from agentgym.rollout.records import EpisodeGroup


def collect_episodes(collector: Collector, seeds: Sequence[int], samples: int, sampling: SamplingParams, *,
                     group_prefix: str = "eval-", chunk_tasks: int | None = None,
                     on_chunk: Callable[[int, list[EpisodeGroup]], None] | None = None) -> list[EpisodeGroup]:
    """Play ``samples`` episodes of every task seed with the collector's policy; one group per task.

    Tasks run in chunks of ``chunk_tasks`` (all at once when None): each chunk is one ``collect``
    call, so the chunk's ``chunk_tasks × samples`` episodes share every batched ``generate``.
    Chunk ``c`` samples with seed ``sampling.seed + c`` (when seeded), so the same seeds and chunking
    always give the same episodes, and greedy decoding gives the same episodes under any chunking.

    Args:
        collector: envs, policy and prompt renderer.
        seeds: task seeds (reset seeds), in order.
        samples: episodes per task (the group size; pass@k needs more than one).
        sampling: generation settings.
        group_prefix: group ids are ``{group_prefix}{index}`` with the task's index in ``seeds``.
        chunk_tasks: tasks per ``collect`` call.
        on_chunk: called with (index of the chunk's first task, its groups) as each chunk finishes.

    Returns:
        One ``EpisodeGroup`` per seed, in order.

    Example:
        >>> import agentgym
        >>> from agentgym.backends.transformers_backend import TransformersPolicy
        >>> from agentgym.backends.tiny import TinyModelConfig
        >>> from agentgym.rollout.prompt import PromptRenderer
        >>> policy = TransformersPolicy.from_pretrained(TinyModelConfig(num_layers=1))
        >>> collector = Collector(lambda: agentgym.make("maze-v0", size=2, max_turns=2), policy,
        ...                       PromptRenderer(policy.tokenizer))
        >>> groups = collect_episodes(collector, [5, 6, 7], 2, SamplingParams(max_new_tokens=4), chunk_tasks=2)
        >>> [g.group_id for g in groups], [len(g.trajectories) for g in groups]
        (['eval-0', 'eval-1', 'eval-2'], [2, 2, 2])
    """
    chunk = max(1, chunk_tasks or len(seeds) or 1)
    groups: list[EpisodeGroup] = []
    for number, start in enumerate(range(0, len(seeds), chunk)):
        part = list(seeds[start:start + chunk])
        params = sampling if sampling.seed is None else replace(sampling, seed=sampling.seed + number)
        collected = collector.collect(part, samples, params, group_prefix="chunk-")
        renamed = [EpisodeGroup(f"{group_prefix}{start + i}", g.task_id, g.seed,
                                [replace(t, trajectory_id=f"{group_prefix}{start + i}-t{k}")
                                 for k, t in enumerate(g.trajectories)])
                   for i, g in enumerate(collected)]
        if on_chunk is not None:
            on_chunk(start, renamed)
        groups += renamed
    return groups


class InfoRecorder(Env):
    """Wraps an env and keeps the current episode's reset observation and every step's info.

    The collector never shows infos to its caller; the trajectory log wants them. ``episode``
    returns ``(seed, first observation, first info, [step infos])`` of the episode in progress or
    just finished.
    """

    def __init__(self, env: Env) -> None:
        self.env = env
        self.has_expert = getattr(env, "has_expert", False)  # type: ignore[misc]
        self._seed: int | None = None
        self._first: tuple[str, dict[str, Any]] = ("", {})
        self._infos: list[dict[str, Any]] = []

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        self._seed, self._first, self._infos = seed, (obs, info), []
        return obs, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        result = self.env.step(action)
        self._infos.append(result[4])
        return result

    def expert_action(self) -> str | None:
        return self.env.expert_action()

    def episode(self) -> tuple[int | None, str, dict[str, Any], list[dict[str, Any]]]:
        """(reset seed, first observation, first info, step infos) of the current episode."""
        return self._seed, self._first[0], self._first[1], list(self._infos)

    def close(self) -> None:
        self.env.close()
