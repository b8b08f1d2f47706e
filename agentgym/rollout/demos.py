"""Expert demonstrations: run an env's expert and record prompt/response turns for SFT."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from agentgym.core import Env
from agentgym.errors import ConfigError
from agentgym.rollout.actions import ActionFormat
from agentgym.rollout.prompt import PromptRenderer
from agentgym.rollout.records import Turn


def format_action(action: str, fmt: ActionFormat) -> str:
    """The response text a policy should produce for ``action`` in the given format."""
    return f"<action>{action}</action>" if fmt == "tag" else action


def collect_demos(make_env: Callable[[], Env], renderer: PromptRenderer, seeds: Sequence[int], *,
                  action_format: ActionFormat = "plain") -> tuple[list[Turn], dict[str, float]]:
    """Play the expert on each seed; return its turns (prompts rendered exactly as in rollouts).

    Response ids are the formatted action followed by the end-of-turn token, so the policy learns
    to stop. Returns the turns and the expert's success rate over the seeds.

    Raises:
        ConfigError: the env has no expert.
    """
    env = make_env()
    if not getattr(env, "has_expert", False):
        env.close()
        raise ConfigError("sft.enabled needs an env with an expert; set sft.enabled=false for this env")
    tokenizer = renderer.tokenizer
    turns: list[Turn] = []
    successes = 0
    try:
        for seed in seeds:
            obs, info = env.reset(seed=seed)
            conv = renderer.start(obs, info)
            while True:
                action = env.expert_action()
                if action is None:
                    break
                prompt = renderer.prompt_ids(conv)
                text = format_action(action, action_format)
                response = list(tokenizer.encode(text, add_special_tokens=False)) + [tokenizer.eos_token_id]
                state_key = info["state_key"]
                obs, reward, terminated, truncated, info = env.step(action)
                turns.append(Turn(prompt, response, [0.0] * len(response), float(reward), state_key,
                                  action=action, observation=obs))
                if terminated or truncated:
                    successes += bool(info.get("success", False))
                    break
                renderer.record(conv, response, action, obs, info)
    finally:
        env.close()
    return turns, {"expert_success_rate": successes / max(len(seeds), 1), "demo_turns": float(len(turns))}
