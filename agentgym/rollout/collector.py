"""``Collector``: runs B tasks × G group members through envs with one policy and records turns.

Every turn it renders the prompts of all live episodes, makes one batched ``generate`` call,
parses the actions and steps the envs concurrently (local envs or ``RemoteEnv`` sessions alike).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from agentgym.rollout.actions import ActionFormat, parse_action
from agentgym.core import Env
from agentgym.errors import ConfigError
from agentgym.rollout.policy import Policy, SamplingParams
from agentgym.rollout.prompt import Conversation, PromptRenderer
from agentgym.rollout.records import EpisodeGroup, Trajectory, Turn


@dataclass
class _Episode:
    env: Env
    seed: int
    conv: Conversation
    state_key: str
    task_id: str
    turns: list[Turn] = field(default_factory=list)
    over: bool = False
    success: bool = False
    truncated: bool = False


@dataclass
class CollectStats:
    """Where one ``collect`` call spent its time (seconds) and how much it generated."""

    generate_s: float = 0.0
    env_s: float = 0.0
    render_s: float = 0.0
    total_s: float = 0.0
    generated_tokens: int = 0
    prompt_tokens: int = 0
    turns: int = 0


class Collector:
    """Collects groups of trajectories.

    Args:
        make_env: zero-argument factory of envs (``lambda: agentgym.make("maze-v0")`` or
            ``lambda: RemoteEnv("maze-v0", client=shared_client)``); envs are created once and reused.
        policy: the generation backend.
        renderer: prompt rendering (mode, window, action format).
        action_format: how responses are parsed into actions.
        env_workers: threads stepping envs concurrently; 0 steps them in the calling thread
            (best for cheap in-process envs), ``None`` picks 0 for local envs and 16 otherwise.
        max_prompt_tokens: an episode whose next prompt would be longer is truncated there.
    """

    def __init__(self, make_env: Callable[[], Env], policy: Policy, renderer: PromptRenderer, *,
                 action_format: ActionFormat = "plain", env_workers: int | None = None,
                 max_prompt_tokens: int = 4096) -> None:
        self.make_env = make_env
        self.policy = policy
        self.renderer = renderer
        self.action_format = action_format
        self.env_workers = env_workers
        self.max_prompt_tokens = max_prompt_tokens
        self._envs: list[Env] = []
        self._pool: ThreadPoolExecutor | None = None
        self.last_stats = CollectStats()

    def _ensure_envs(self, count: int) -> list[Env]:
        while len(self._envs) < count:
            self._envs.append(self.make_env())
        if self._pool is None:
            workers = self.env_workers
            if workers is None:
                from agentgym.guard import EpisodeGuard

                workers = 0 if all(isinstance(e, EpisodeGuard) for e in self._envs) else 16
            if workers > 0:
                self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="agentgym-collect")
        return self._envs[:count]

    def _map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        if self._pool is None:
            return [fn(item) for item in items]
        return list(self._pool.map(fn, items))

    def collect(self, task_seeds: Sequence[int], group_size: int, sampling: SamplingParams, *,
                options: dict[str, Any] | None = None, group_prefix: str = "g") -> list[EpisodeGroup]:
        """Run ``len(task_seeds)`` groups of ``group_size`` episodes to the end.

        The members of group ``b`` are ``group_size`` resets with ``task_seeds[b]`` (and ``options``).
        Generation is seeded from ``sampling.seed`` (per turn: ``seed + turn``) so a run is
        reproducible; the group members still differ because they sample different tokens.
        """
        if group_size < 1:
            raise ConfigError(f"rollout.group_size must be >= 1, got {group_size}")
        stats = CollectStats()
        started = time.perf_counter()
        envs = self._ensure_envs(len(task_seeds) * group_size)
        seeds = [seed for seed in task_seeds for _ in range(group_size)]

        t0 = time.perf_counter()
        resets = self._map(lambda pair: pair[0].reset(seed=pair[1], options=options), list(zip(envs, seeds)))
        stats.env_s += time.perf_counter() - t0
        episodes = []
        for env, seed, (obs, info) in zip(envs, seeds, resets):
            episodes.append(_Episode(env, seed, self.renderer.start(obs, info), info["state_key"],
                                     str(info.get("task_id", f"seed:{seed}"))))

        turn = 0
        while True:
            live = [e for e in episodes if not e.over]
            if not live:
                break
            t0 = time.perf_counter()
            prompts = [self.renderer.prompt_ids(e.conv) for e in live]
            stats.render_s += time.perf_counter() - t0
            for episode, prompt in zip(live, prompts):
                if len(prompt) > self.max_prompt_tokens:
                    episode.over, episode.truncated = True, True
            pairs = [(e, p) for e, p in zip(live, prompts) if not e.over]
            if not pairs:
                break
            params = sampling if sampling.seed is None else _with_seed(sampling, sampling.seed + turn)
            t0 = time.perf_counter()
            generations = self.policy.generate([p for _, p in pairs], params)
            stats.generate_s += time.perf_counter() - t0
            texts = [self.policy.tokenizer.decode(g.token_ids, skip_special_tokens=True) for g in generations]
            parsed = [parse_action(text, self.action_format) for text in texts]
            t0 = time.perf_counter()
            results = self._map(lambda item: item[0].env.step(item[1].action),
                                [(e, a) for (e, _), a in zip(pairs, parsed)])
            stats.env_s += time.perf_counter() - t0
            for (episode, prompt), generation, action, result in zip(pairs, generations, parsed, results):
                obs, reward, terminated, truncated, info = result
                extras: dict[str, Any] = {}
                if generation.entropies is not None:
                    extras["entropies"] = generation.entropies
                episode.turns.append(Turn(
                    prompt_ids=list(prompt), response_ids=list(generation.token_ids),
                    response_logprobs=list(generation.logprobs), reward=float(reward),
                    state_key=episode.state_key, invalid=(not action.valid) or bool(info.get("invalid_action")),
                    action=action.action, observation=obs, extras=extras,
                ))
                stats.generated_tokens += len(generation.token_ids)
                stats.prompt_tokens += len(prompt)
                episode.state_key = info["state_key"]
                if terminated or truncated:
                    episode.over, episode.truncated = True, bool(truncated and not terminated)
                    episode.success = bool(info.get("success", False))
                else:
                    t0 = time.perf_counter()
                    self.renderer.record(episode.conv, list(generation.token_ids), action.action, obs, info)
                    stats.render_s += time.perf_counter() - t0
            turn += 1

        groups = []
        for b, seed in enumerate(task_seeds):
            members = episodes[b * group_size:(b + 1) * group_size]
            gid = f"{group_prefix}{b}"
            trajectories = [Trajectory(m.turns, m.task_id, seed, success=m.success, truncated=m.truncated,
                                       trajectory_id=f"{gid}-t{j}") for j, m in enumerate(members)]
            groups.append(EpisodeGroup(gid, members[0].task_id, seed, trajectories))
        stats.turns = sum(len(e.turns) for e in episodes)
        stats.total_s = time.perf_counter() - started
        self.last_stats = stats
        return groups

    def close(self) -> None:
        """Close the envs and the stepping threads."""
        for env in self._envs:
            env.close()
        self._envs = []
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None


def _with_seed(params: SamplingParams, seed: int) -> SamplingParams:
    from dataclasses import replace

    return replace(params, seed=seed)
