"""``check_env``: the text-env contract as code.

It drives an env through several episodes and raises ``EnvContractError`` with a message that
names the broken rule. Tests run it over every registered env.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from agentgym.core import Env
from agentgym.errors import EnvContractError, EnvCrashed, EpisodeFinished, ResetNeeded
from agentgym.guard import EpisodeGuard
from agentgym.registry import EnvSpec
from agentgym.registry import spec as lookup_spec

EnvSource = str | EnvSpec | EpisodeGuard | Callable[[], Env]
_GARBAGE_ACTIONS = ("", "   ", "\x00\u2603 <not an action>", "x" * 5000)


def _factory_for(source: EnvSource) -> Callable[[], EpisodeGuard]:
    if isinstance(source, str):
        source = lookup_spec(source)
    if isinstance(source, EnvSpec):
        return source.make
    if isinstance(source, EpisodeGuard):
        if source._factory is None:
            raise EnvContractError("check_env needs an env made by agentgym.make() (or an id)")
        return source._factory
    if callable(source):
        def factory() -> EpisodeGuard:
            env = source()
            if isinstance(env, EpisodeGuard):
                return env
            return EpisodeGuard(env, factory=factory)

        return factory
    raise EnvContractError(f"check_env takes an env id, EnvSpec, made env or factory, got {source!r}")


def _fail(rule: str, detail: str) -> EnvContractError:
    return EnvContractError(f"check_env: {rule}: {detail}")


def _check_info_types(info: dict[str, Any], where: str) -> None:
    try:
        hash(info["state_key"])
    except (KeyError, TypeError) as exc:
        raise _fail("state_key", f"{where} info['state_key'] missing or unhashable ({exc})") from None
    if not isinstance(info["state_key"], str):
        raise _fail("state_key", f"{where} info['state_key'] must be a str")
    typed = {
        "task_id": str,
        "invalid_action": bool,
        "success": bool,
        "instructions": str,
    }
    for key, kind in typed.items():
        if key in info and not isinstance(info[key], kind):
            raise _fail(f"info[{key!r}]", f"{where}: must be {kind.__name__}, got {info[key]!r:.80}")
    if "admissible_actions" in info:
        acts = info["admissible_actions"]
        if not isinstance(acts, list) or not all(isinstance(a, str) for a in acts):
            raise _fail("info['admissible_actions']", f"{where}: must be a list of str")
    if "tools" in info:
        tools = info["tools"]
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise _fail("info['tools']", f"{where}: must be a list of JSON-schema dicts")
        for tool in tools:
            fn = tool.get("function", tool)
            if not isinstance(fn.get("name"), str) or "parameters" not in fn:
                raise _fail("info['tools']", f"{where}: each tool needs a name and parameters: {tool!r:.120}")
    try:
        json.dumps(info, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise _fail("JSON-safe info", f"{where} info does not survive json.dumps: {exc}") from None


def _pick_action(env: EpisodeGuard, info: dict[str, Any], rng: np.random.Generator, turn: int) -> str:
    """Mix expert moves, admissible moves and garbage so both valid and invalid paths run."""
    roll = rng.random()
    if roll < 0.1:
        return _GARBAGE_ACTIONS[turn % len(_GARBAGE_ACTIONS)]
    if env.has_expert and roll < 0.55:
        expert = env.expert_action()
        if expert is not None:
            return expert
    actions = info.get("admissible_actions") or []
    if actions:
        return actions[int(rng.integers(len(actions)))]
    expert = env.expert_action() if env.has_expert else None
    return expert if expert is not None else "look"


def _run(env: EpisodeGuard, seed: int, options: dict[str, Any] | None, actions: list[str] | None,
         rng: np.random.Generator | None, max_steps: int) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run an episode; returns the actions taken and every (obs, reward, term, trunc, info)."""
    obs, info = env.reset(seed=seed, options=options)
    _check_info_types(info, "reset()")
    trace: list[tuple[Any, ...]] = [(obs, 0.0, False, False, info)]
    taken: list[str] = []
    for turn in range(max_steps):
        if actions is not None:
            if turn >= len(actions):
                break
            action = actions[turn]
        else:
            assert rng is not None
            action = _pick_action(env, info, rng, turn)
        try:
            obs, reward, terminated, truncated, info = env.step(action)
        except EnvCrashed as exc:
            raise _fail("step raised", f"step({action[:40]!r}) raised: {exc}. Answer actions the env cannot "
                        "parse or apply with an observation and info['invalid_action']=True") from exc
        _check_info_types(info, f"step {turn + 1}")
        if not isinstance(reward, float) or not math.isfinite(reward):
            raise _fail("reward", f"step {turn + 1} reward {reward!r} is not a finite float")
        taken.append(action)
        trace.append((obs, reward, terminated, truncated, info))
        if terminated or truncated:
            break
    return taken, trace


def _same(a: list[tuple[Any, ...]], b: list[tuple[Any, ...]], rule: str, what: str) -> None:
    for i, (x, y) in enumerate(zip(a, b)):
        if json.dumps(x, sort_keys=True) != json.dumps(y, sort_keys=True):
            names = ("observation", "reward", "terminated", "truncated", "info")
            field = next(n for n, u, v in zip(names, x, y) if json.dumps(u, sort_keys=True) != json.dumps(v, sort_keys=True))
            raise _fail(rule, f"{what} differ at step {i} in {field}: {str(x[names.index(field)])[:200]!r} vs "
                              f"{str(y[names.index(field)])[:200]!r}")
    if len(a) != len(b):
        raise _fail(rule, f"{what} have different lengths ({len(a)} vs {len(b)})")


def check_env(env: EnvSource, *, seed: int = 0, num_episodes: int = 3, max_steps: int = 200) -> None:
    """Check that an env honours the contract of ``agentgym.core.Env``; raise if it does not.

    Checks: reset/step types and ``info`` key types (``state_key`` a hashable str, infos
    JSON-safe); determinism (same seed, options and actions ⇒ identical observations, rewards and
    infos); the episode ends within ``max_turns`` (or ``max_steps``); ``step`` before ``reset``
    raises ``ResetNeeded`` and after the end raises ``EpisodeFinished``; invalid strings are
    answered, never raised; ``task_id`` replays the task; fork by replay and by snapshot (when
    supported) continue exactly like the original; the expert returns strings; ``close`` is
    idempotent.

    Args:
        env: an env id, an ``EnvSpec``, an env made by ``agentgym.make``, or a zero-argument
            factory returning an ``agentgym.Env``.
        seed: first episode seed; episode ``i`` uses ``seed + i``.
        num_episodes: episodes driven with a seeded mix of expert, admissible and garbage actions.
        max_steps: cap for envs without ``max_turns``; an episode still running then fails the check.

    Raises:
        EnvContractError: with the rule that was broken and where.

    Example:
        >>> from agentgym.examples import EchoEnv
        >>> check_env(lambda: EchoEnv(target="hi"))
    """
    factory = _factory_for(env)
    first, second = factory(), factory()
    try:
        try:
            first.step("anything")
        except ResetNeeded:
            pass
        else:
            raise _fail("order", "step() before reset() must raise ResetNeeded")

        limit = first.max_turns or max_steps
        for episode in range(num_episodes):
            episode_seed = seed + episode
            rng = np.random.default_rng([seed, episode])
            actions, trace = _run(first, episode_seed, None, None, rng, limit)
            obs, _, terminated, truncated, info = trace[-1]
            if not (terminated or truncated):
                raise _fail("episode end", f"episode {episode} still running after {limit} steps; set max_turns")
            try:
                first.step(actions[-1] if actions else "x")
            except EpisodeFinished:
                pass
            else:
                raise _fail("order", "step() after the episode ended must raise EpisodeFinished")

            _, replayed = _run(second, episode_seed, None, actions, None, limit)
            _same(trace, replayed, "determinism", "two runs with the same seed and actions")

            task_id = trace[0][4].get("task_id")
            if task_id is not None:
                _, by_task = _run(second, episode_seed + 7919, {"task_id": task_id}, actions, None, limit)
                if by_task[0][0] != trace[0][0]:
                    raise _fail("task_id", f"reset(options={{'task_id': {task_id!r}}}) did not replay the task")

            _check_fork(first, episode_seed, actions)

        for garbage in _GARBAGE_ACTIONS:
            first.reset(seed=seed)
            try:
                first.step(garbage)
            except EnvCrashed as exc:
                raise _fail("invalid action", f"step({garbage[:20]!r}) raised instead of answering: {exc}") from exc
        first.reset(seed=seed)
        if first.has_expert:
            expert = first.expert_action()
            if expert is not None and not isinstance(expert, str):
                raise _fail("expert", f"expert_action() must return a str or None, got {expert!r}")
    finally:
        first.close()
        first.close()
        second.close()


def _check_fork(env: EpisodeGuard, seed: int, actions: list[str]) -> None:
    """Fork halfway through a known episode; every fork must continue exactly like the original."""
    if len(actions) < 1:
        return
    cut = len(actions) // 2
    env.reset(seed=seed)
    for action in actions[:cut]:
        env.step(action)
    modes = ["replay"] + (["snapshot"] if env.supports_snapshot else [])
    forks = [env.fork(mode) for mode in modes]  # type: ignore[arg-type]
    try:
        traces: list[list[tuple[Any, ...]]] = [[] for _ in range(len(forks) + 1)]
        for action in actions[cut:]:
            for trace, member in zip(traces, [env, *forks]):
                trace.append(("<episode already over>",) * 5 if member.episode_over else member.step(action))
        for mode, trace in zip(modes, traces[1:]):
            _same(traces[0], trace, "fork", f"the original and its {mode} fork")
        if forks and forks[0].turn != env.turn:
            raise _fail("fork", "a fork must carry the turn count of its parent")
    finally:
        for member in forks:
            member.close()
