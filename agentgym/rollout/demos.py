"""Expert demonstrations for SFT: the env's expert played through the ``Collector`` (``collect_demos``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from agentgym.core import Env
from agentgym.errors import ConfigError
from agentgym.rollout.actions import ActionFormat
from agentgym.rollout.actors import ExpertActor, format_action
from agentgym.rollout.collector import Collector
from agentgym.rollout.policy import SamplingParams
from agentgym.rollout.pool import LocalEnvPool
from agentgym.rollout.prompt import PromptRenderer
from agentgym.rollout.records import Turn

__all__ = ["DEMO_BATCH", "collect_demos", "format_action"]

#: Expert episodes played side by side (envs open at once).
DEMO_BATCH = 16


def collect_demos(make_env: Callable[[], Env], renderer: PromptRenderer, seeds: Sequence[int], *,
                  action_format: ActionFormat = "plain") -> tuple[list[Turn], dict[str, float]]:
    """Play the expert on each seed; return its turns (prompts rendered exactly as in rollouts).

    Response ids are the formatted action followed by the end-of-turn token, so the policy learns
    to stop. Returns the turns and the expert's success rate over the seeds.

    Args:
        make_env: a zero-argument env factory; an ``EnvPool`` works too, through the stand-alone envs
            it makes (the expert is asked through the env itself).
        renderer: the rollouts' prompt renderer.
        seeds: one episode per seed.
        action_format: how the action is written in the response.

    Raises:
        ConfigError: the env has no expert.

    Example:
        >>> import agentgym
        >>> from agentgym.backends.tiny import TinyModelConfig, build_tiny_model
        >>> _, tokenizer = build_tiny_model(TinyModelConfig(num_layers=1))
        >>> turns, stats = collect_demos(lambda: agentgym.make("maze-v0", size=2), PromptRenderer(tokenizer),
        ...                              [3])
        >>> stats["expert_success_rate"], turns[0].response_ids[-1] == tokenizer.eos_token_id
        (1.0, True)
    """
    probe = make_env()
    try:
        has_expert = bool(getattr(probe, "has_expert", False))
    finally:
        probe.close()
    if not has_expert:
        raise ConfigError("sft.enabled needs an env with an expert (an env declares one by defining "
                          "expert_action()); set sft.enabled=false for this env")
    # A pool's own slots may live elsewhere (Ray actors, batched services); the expert needs envs it can ask.
    collector = Collector(LocalEnvPool(make_env), ExpertActor(renderer.tokenizer, action_format), renderer,
                          max_prompt_tokens=None)
    trajectories = []
    try:
        for start in range(0, len(seeds), DEMO_BATCH):  # bounded: an env service caps its sessions
            groups = collector.collect(list(seeds[start:start + DEMO_BATCH]), 1, SamplingParams(),
                                       group_prefix=f"demo{start}-")
            trajectories += [t for g in groups for t in g.trajectories]
    finally:
        collector.close()
    turns = [turn for t in trajectories for turn in t.turns]
    successes = sum(t.success for t in trajectories)
    return turns, {"expert_success_rate": successes / max(len(seeds), 1), "demo_turns": float(len(turns))}
