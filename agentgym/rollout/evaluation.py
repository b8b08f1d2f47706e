"""Evaluation episodes through the ``Collector``, in chunks of tasks: ``collect_episodes``, what training's
held-out evaluations and ``agentgym eval`` (every kind of policy) both call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from agentgym.errors import ConfigError
from agentgym.rollout.collector import Collector
from agentgym.rollout.policy import SamplingParams
from agentgym.rollout.records import EpisodeGroup


def collect_episodes(collector: Collector, seeds: Sequence[int], samples: int, sampling: SamplingParams, *,
                     group_prefix: str = "eval-", chunk_tasks: int | None = None,
                     on_chunk: Callable[[int, list[EpisodeGroup]], None] | None = None,
                     group_ids: Sequence[str] | None = None) -> list[EpisodeGroup]:
    """Play ``samples`` episodes of every task seed with the collector's actor; one group per task.

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
        group_ids: the group ids instead, one per seed.
        chunk_tasks: tasks per ``collect`` call.
        on_chunk: called with (index of the chunk's first task, its groups) as each chunk finishes.

    Returns:
        One ``EpisodeGroup`` per seed, in order; trajectory ids are ``{group id}-t{sample}``.

    Raises:
        ConfigError: ``group_ids`` does not name every seed.

    Example:
        >>> import agentgym
        >>> from agentgym.backends.transformers_backend import TransformersPolicy
        >>> from agentgym.backends.tiny import TinyModelConfig
        >>> from agentgym.rollout.prompt import PromptRenderer
        >>> policy = TransformersPolicy.from_pretrained(TinyModelConfig(num_layers=1))
        >>> collector = Collector(lambda: agentgym.make("maze-v0", size=2, max_turns=2), policy,
        ...                       PromptRenderer(policy.tokenizer))
        >>> groups = collect_episodes(collector, [5, 6, 7], 2, SamplingParams(max_new_tokens=4),
        ...                           chunk_tasks=2)
        >>> [g.group_id for g in groups], [len(g.trajectories) for g in groups]
        (['eval-0', 'eval-1', 'eval-2'], [2, 2, 2])
    """
    names = [f"{group_prefix}{i}" for i in range(len(seeds))] if group_ids is None else list(group_ids)
    if len(names) != len(seeds):
        raise ConfigError(f"collect_episodes got {len(names)} group ids for {len(seeds)} seeds")
    chunk = max(1, chunk_tasks or len(seeds) or 1)
    groups: list[EpisodeGroup] = []
    for number, start in enumerate(range(0, len(seeds), chunk)):
        params = sampling if sampling.seed is None else replace(sampling, seed=sampling.seed + number)
        collected = collector.collect(list(seeds[start:start + chunk]), samples, params,
                                      group_ids=names[start:start + chunk])
        if on_chunk is not None:
            on_chunk(start, collected)
        groups += collected
    return groups
