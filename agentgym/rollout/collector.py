"""``Collector``: runs B tasks × G group members through envs with one policy and records turns.

Every turn it renders the prompts of all live episodes, makes one batched ``generate`` call,
parses the actions and steps the envs concurrently (local envs or ``RemoteEnv`` sessions alike).
Rollout hooks (``agentgym.rollout.hooks``) may adjust sampling, ask for forks after a turn — the
collector performs them — and annotate or filter the finished groups.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from agentgym.core import Env
from agentgym.errors import ConfigError
from agentgym.rollout.actions import ActionFormat, parse_action
from agentgym.rollout.hooks import CollectContext, EpisodeView, Fork, RolloutHooks
from agentgym.rollout.policy import Policy, SamplingParams, Scorer
from agentgym.rollout.prompt import Conversation, PromptRenderer
from agentgym.rollout.records import EpisodeGroup, Trajectory, Turn


@dataclass
class _Episode:
    env: Env
    group: int
    trajectory_id: str
    conv: Conversation
    state_key: str
    task_id: str
    info: dict[str, Any]
    """The env's latest info."""
    answer: str | list[str] | None = None
    """The privileged ``info["answer"]`` (from reset, or the latest step that carried one)."""
    turns: list[Turn] = field(default_factory=list)
    over: bool = False
    success: bool = False
    truncated: bool = False
    parent_id: str | None = None
    fork_turn: int | None = None
    owns_env: bool = False
    """Forks and top-ups get an env of their own, closed when the collection ends."""

    def view(self) -> EpisodeView:
        return EpisodeView(self.trajectory_id, self.group, tuple(self.turns), self.info, self.over,
                           self.parent_id, self.fork_turn)


@dataclass
class CollectStats:
    """Where one ``collect`` call spent its time (seconds) and how much it generated."""

    generate_s: float = 0.0
    env_s: float = 0.0
    render_s: float = 0.0
    hooks_s: float = 0.0
    total_s: float = 0.0
    generated_tokens: int = 0
    prompt_tokens: int = 0
    turns: int = 0
    forks: int = 0
    tool_calls: int = 0
    tool_call_reports: int = 0
    """Steps whose info carried ``tool_calls`` (an env that never reports it cannot be checked)."""


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

    def context(self, iteration: int = 0) -> CollectContext:
        """The ``CollectContext`` hooks get: the policy's tokenizer, and the policy as scorer if it is one."""
        scorer = self.policy if isinstance(self.policy, Scorer) else None
        return CollectContext(self.policy.tokenizer, scorer, iteration)

    def collect(self, task_seeds: Sequence[int], group_size: int, sampling: SamplingParams, *,
                options: dict[str, Any] | None = None, group_prefix: str = "g",
                hooks: RolloutHooks | None = None, iteration: int = 0) -> list[EpisodeGroup]:
        """Run ``len(task_seeds)`` groups of ``group_size`` episodes (plus any forks) to the end.

        The members of group ``b`` are ``group_size`` resets with ``task_seeds[b]`` (and ``options``).
        Generation is seeded from ``sampling.seed`` (per turn: ``seed + turn``) so a run is
        reproducible; the group members still differ because they sample different tokens.
        ``hooks`` (see ``agentgym.rollout.hooks``) may change the sampling parameters, fork episodes
        after any turn and annotate or filter the groups returned.

        Raises:
            ConfigError: ``group_size`` < 1, or a hook asked for a fork the collector cannot make.
        """
        if group_size < 1:
            raise ConfigError(f"rollout.group_size must be >= 1, got {group_size}")
        hooks = hooks or RolloutHooks()
        context = self.context(iteration)
        hooks.before_collect(len(task_seeds))
        sampling = hooks.sampling(sampling)
        stats = CollectStats()
        started = time.perf_counter()
        envs = self._ensure_envs(len(task_seeds) * group_size)
        seeds = [seed for seed in task_seeds for _ in range(group_size)]

        t0 = time.perf_counter()
        resets = self._map(lambda pair: pair[0].reset(seed=pair[1], options=options), list(zip(envs, seeds)))
        stats.env_s += time.perf_counter() - t0
        episodes = [self._start(env, i // group_size, f"{group_prefix}{i // group_size}-t{i % group_size}",
                                seed, obs, info)
                    for i, (env, seed, (obs, info)) in enumerate(zip(envs, seeds, resets))]
        members = [group_size] * len(task_seeds)  # trajectory ids handed out per group so far

        turn = 0
        try:
            while True:
                live = [e for e in episodes if not e.over]
                if not live:
                    break
                self._turn(live, sampling, turn, stats)
                turn += 1
                t0 = time.perf_counter()
                forks = hooks.after_turn([e.view() for e in episodes], context)
                if forks:
                    episodes += self._fork(forks, episodes, members, task_seeds, group_prefix, options, stats)
                stats.hooks_s += time.perf_counter() - t0
        finally:
            for episode in episodes:
                if episode.owns_env:
                    episode.env.close()

        groups = []
        for b, seed in enumerate(task_seeds):
            gid = f"{group_prefix}{b}"
            mine = [e for e in episodes if e.group == b]
            trajectories = [Trajectory(e.turns, e.task_id, seed, success=e.success, truncated=e.truncated,
                                       trajectory_id=e.trajectory_id, parent_id=e.parent_id,
                                       fork_turn=e.fork_turn, answer=e.answer)
                            for e in mine]
            groups.append(EpisodeGroup(gid, mine[0].task_id, seed, trajectories))
        t0 = time.perf_counter()
        groups = hooks.after_collect(groups, context)
        stats.hooks_s += time.perf_counter() - t0
        stats.turns = sum(len(e.turns) for e in episodes)
        stats.total_s = time.perf_counter() - started
        self.last_stats = stats
        return groups

    def _start(self, env: Env, group: int, trajectory_id: str, seed: int, obs: str, info: dict[str, Any],
               *, owns_env: bool = False) -> _Episode:
        return _Episode(env, group, trajectory_id, self.renderer.start(obs, info), info["state_key"],
                        str(info.get("task_id", f"seed:{seed}")), info, info.get("answer"), owns_env=owns_env)

    def _turn(self, live: list[_Episode], sampling: SamplingParams, turn: int, stats: CollectStats) -> None:
        """One batched generate over the live episodes, then one step of each env."""
        t0 = time.perf_counter()
        prompts = [self.renderer.prompt_ids(e.conv) for e in live]
        stats.render_s += time.perf_counter() - t0
        for episode, prompt in zip(live, prompts):
            if len(prompt) > self.max_prompt_tokens:
                episode.over, episode.truncated = True, True
        pairs = [(e, p) for e, p in zip(live, prompts) if not e.over]
        if not pairs:
            return
        params = sampling if sampling.seed is None else replace(sampling, seed=sampling.seed + turn)
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
            if generation.top_logprobs is not None:
                extras["top_logprobs"] = [[list(pair) for pair in position] for position in generation.top_logprobs]
            tool_calls = int(info.get("tool_calls", 0) or 0)
            episode.turns.append(Turn(
                prompt_ids=list(prompt), response_ids=list(generation.token_ids),
                response_logprobs=list(generation.logprobs), reward=float(reward),
                state_key=episode.state_key, invalid=(not action.valid) or bool(info.get("invalid_action")),
                action=action.action, observation=obs, tool_calls=tool_calls, extras=extras,
            ))
            stats.generated_tokens += len(generation.token_ids)
            stats.prompt_tokens += len(prompt)
            stats.tool_calls += tool_calls
            stats.tool_call_reports += "tool_calls" in info
            episode.state_key = info["state_key"]
            episode.info = info
            episode.answer = info.get("answer", episode.answer)
            if terminated or truncated:
                episode.over, episode.truncated = True, bool(truncated and not terminated)
                episode.success = bool(info.get("success", False))
            else:
                t0 = time.perf_counter()
                self.renderer.record(episode.conv, list(generation.token_ids), action.action, obs, info)
                stats.render_s += time.perf_counter() - t0

    def _fork(self, forks: Sequence[Fork], episodes: list[_Episode], members: list[int],
              task_seeds: Sequence[int], group_prefix: str, options: dict[str, Any] | None,
              stats: CollectStats) -> list[_Episode]:
        """Perform the hooks' fork requests; returns the new episodes."""
        by_id = {e.trajectory_id: e for e in episodes}
        made: list[_Episode] = []
        for fork in forks:
            if not 0 <= fork.group_index < len(task_seeds):
                raise ConfigError(f"a rollout hook asked for a fork in group {fork.group_index}, but this "
                                  f"collection has groups 0..{len(task_seeds) - 1}")
            trajectory_id = f"{group_prefix}{fork.group_index}-t{members[fork.group_index]}"
            members[fork.group_index] += 1
            if fork.source_id is None:
                env = self.make_env()
                seed = task_seeds[fork.group_index]
                obs, info = env.reset(seed=seed, options=options)
                made.append(self._start(env, fork.group_index, trajectory_id, seed, obs, info, owns_env=True))
                continue
            source = by_id.get(fork.source_id)
            if source is None or source.over or source.group != fork.group_index:
                state = "unknown" if source is None else ("over" if source.over else "in another group")
                raise ConfigError(f"a rollout hook asked to fork trajectory {fork.source_id!r}, which is "
                                  f"{state}; only live episodes of the fork's group can be forked")
            fork_env = getattr(source.env, "fork", None)
            if fork_env is None:
                raise ConfigError(f"{type(source.env).__name__} cannot fork; make envs with agentgym.make() or "
                                  "use RemoteEnv, which fork by snapshot/restore or deterministic replay")
            made.append(replace(source, env=fork_env(), trajectory_id=trajectory_id, conv=copy.deepcopy(source.conv),
                                turns=list(source.turns), parent_id=source.trajectory_id,
                                fork_turn=len(source.turns), owns_env=True))
        stats.forks += len(made)
        return made

    def close(self) -> None:
        """Close the envs and the stepping threads."""
        for env in self._envs:
            env.close()
        self._envs = []
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
