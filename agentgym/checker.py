"""``check_env``: the text-env contract as code, one function per rule, then the quality gates.

``check_env`` builds the env, records a few seeded episodes of it (expert, admissible and garbage
actions mixed, so valid and invalid paths both run) and calls every rule in ``RULES`` in order; the
first broken rule raises ``CheckFailed`` with ``.rule`` set to its function's name. The rules that
judge returned values read what the *unwrapped* env returned, so a missing ``state_key`` is reported
by ``check_state_key`` rather than by whichever ``EpisodeGuard`` check trips first; the rules about
order and fork drive the guarded env, as users do.

The quality gates (``agentgym.gates``) go beyond the contract and judge the env as a training task;
``check_env(env, gates=GATES)`` runs them after the rules on the same ``CheckRun``.
"""
from __future__ import annotations

import contextlib
import functools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentgym.core import Env
from agentgym.errors import (
    AgentGymError,
    CheckFailed,
    ConfigError,
    EnvContractError,
    EpisodeFinished,
    ResetNeeded,
)
from agentgym.guard import EpisodeGuard
from agentgym.registry import make
from agentgym.registry import spec as lookup_spec
from agentgym.spec import EnvSpec

EnvSource = str | EnvSpec | EpisodeGuard | Callable[[], Env]
Rule = Callable[["CheckRun"], None]
#: A quality gate: judges a ``CheckRun``, raises ``CheckFailed`` naming itself, else returns a one-line
#: note of what it measured (or why it did not apply).
Gate = Callable[["CheckRun"], str]
#: A gate's policy: ``(unwrapped env, last info, rng, last call) -> action``. It may ask the expert
#: through ``_ask_expert(env, last_call)``, which records the answer on the call.
Policy = Callable[[Env, Any, np.random.Generator, "Call"], str]

#: Actions no env can mean: empty, blank, control characters, and long.
GARBAGE_ACTIONS = ("", "   ", "\x00\u2603 <not an action>", "x" * 5000)
#: Seed offset for the task_id rule: a different seed, so only ``task_id`` can pick the same task.
_OTHER_SEED = 7919
_STEP_FIELDS = ("observation", "reward", "terminated", "truncated", "info")


@dataclass
class Call:
    """One recorded call into the unwrapped env: ``reset`` (``action is None``) or ``step(action)``."""

    action: str | None
    """The action stepped, or ``None`` for the ``reset`` that starts the episode."""
    result: Any = None
    """What the env returned (unchecked), or ``None`` if it raised."""
    error: Exception | None = None
    """What the env raised, if it did."""
    expert: list[Any] = field(default_factory=list)
    """What ``expert_action()`` returned (or raised) in the state this call led to, if asked."""

    @property
    def info(self) -> Any:
        """The returned ``info`` (``None`` if the call raised or returned the wrong shape)."""
        size = 2 if self.action is None else 5
        if isinstance(self.result, tuple) and len(self.result) == size:
            return self.result[-1]
        return None


@dataclass
class Episode:
    """A recorded episode of the unwrapped env."""

    seed: int
    options: dict[str, Any] | None
    calls: list[Call]
    """``calls[0]`` is the reset; the rest are steps, up to the first that raised or ended the episode."""
    ended: bool
    """The last step terminated or truncated, or the turn budget ran out."""

    @property
    def actions(self) -> list[str]:
        """The actions of the steps that returned."""
        return [c.action for c in self.calls[1:] if c.error is None and c.action is not None]


@dataclass
class CheckRun:
    """What the rules share: how to build the env, two built instances, and the recorded episodes."""

    factory: Callable[[], EpisodeGuard]
    """Builds a fresh, guarded instance (the rules that need a never-used env call it)."""
    env: EpisodeGuard
    """The instance the episodes were recorded on; the order and fork rules drive it."""
    other: EpisodeGuard
    """A second instance for replays and probes, so they start from a different history."""
    seed: int
    """The first episode's seed; episode ``n`` used ``seed + n``."""
    limit: int
    """Steps per episode: the env's ``max_turns``, or ``check_env``'s ``max_steps`` without one."""
    episodes: list[Episode]
    """The recorded episodes."""
    played: dict[str, list[Episode]] = field(default_factory=dict)
    """The gates' episodes by policy name (``agentgym.gates.POLICIES``), recorded by ``gates.play``."""
    gate_env: EpisodeGuard | None = None
    """The instance the gates play on, made on first use (so the rules' closes cannot reach it)."""

    @classmethod
    def start(cls, source: EnvSource, *, seed: int = 0, num_episodes: int = 3,
              max_steps: int = 200) -> CheckRun:
        """Build two instances of ``source`` and record ``num_episodes`` episodes (see ``check_env``).

        Example:
            >>> from agentgym.examples import EchoEnv
            >>> run = CheckRun.start(lambda: EchoEnv(target="hi"), num_episodes=2)
            >>> check_state_key(run)  # any one rule runs on its own
            >>> [episode.seed for episode in run.episodes], run.limit
            ([0, 1], 200)
            >>> run.close()
        """
        factory = _factory_for(source)
        env, other = factory(), factory()
        limit = env.max_turns or max_steps
        episodes = [
            _record_episode(env, seed + n, limit, rng=np.random.default_rng([seed, n]))
            for n in range(num_episodes)
        ]
        return cls(factory, env, other, seed, limit, episodes)

    @property
    def calls(self) -> list[tuple[str, Call]]:
        """Every recorded call with a label naming where it happened (``episode 0, step 3``)."""
        return [
            (f"episode {n} (seed {ep.seed}), "
             + ("reset()" if i == 0 else f"step {i} ({c.action[:40]!r})"), c)
            for n, ep in enumerate(self.episodes)
            for i, c in enumerate(ep.calls)
        ]

    @property
    def infos(self) -> list[tuple[str, dict[str, Any]]]:
        """Every recorded ``info`` dict with the label of the call that returned it."""
        return [(where, call.info) for where, call in self.calls if isinstance(call.info, dict)]

    @property
    def seeds(self) -> list[int]:
        """The checked seeds: the recorded episodes' seeds, in order."""
        return [episode.seed for episode in self.episodes]

    def close(self) -> None:
        """Close every instance, ignoring errors (``check_close_idempotent`` reports those)."""
        for guard in (self.env, self.other, self.gate_env):
            if guard is None:
                continue
            with contextlib.suppress(Exception):  # cleanup must not hide the rule that failed
                guard.close()


# --- recording -----------------------------------------------------------------------------------


def _record_episode(
    env: EpisodeGuard,
    seed: int,
    limit: int,
    *,
    options: dict[str, Any] | None = None,
    actions: list[str] | None = None,
    policy: Policy | None = None,
    rng: np.random.Generator | None = None,
) -> Episode:
    """Play one episode on ``env.unwrapped``, recording every return and exception.

    Args:
        env: a made env; its unwrapped env is driven directly, so nothing is checked on the way.
        seed: the reset seed.
        limit: the most steps to take.
        options: the reset options.
        actions: replay these actions (the episode stops early if it ends first); else pick them.
        policy: picks the actions when ``actions`` is ``None``; without it, a mix of the expert's
            action, an admissible action and garbage.
        rng: the random source of the picks (default: seeded with ``seed``).

    Returns:
        The episode; it never raises for anything the env does.
    """
    raw = env.unwrapped
    budgeted = env.max_turns is not None
    rng = np.random.default_rng(seed) if rng is None else rng
    reset = _call(None, lambda: raw.reset(seed=seed, options=options))
    calls, info, ended = [reset], reset.info, False
    if reset.error is not None or not isinstance(reset.result, tuple) or len(reset.result) != 2:
        return Episode(seed, options, calls, ended)
    for turn in range(limit):
        if actions is not None:
            if turn >= len(actions):
                break
            action = actions[turn]
        elif policy is not None:
            action = policy(raw, info, rng, calls[-1])
        else:
            action = _pick_action(raw, env.has_expert, info, rng, turn, calls[-1])
        step = _call(action, lambda a=action: raw.step(a))
        calls.append(step)
        if step.error is not None or not isinstance(step.result, tuple) or len(step.result) != 5:
            break
        info = step.info
        # Flags of the wrong type end nothing here; check_step_returns reports them.
        if any(isinstance(flag, (bool, np.bool_)) and flag for flag in step.result[2:4]):
            ended = True
            break
    if budgeted and len(calls) - 1 == limit:
        ended = True  # the guard truncates here
    return Episode(seed, options, calls, ended)


def _call(action: str | None, fn: Callable[[], Any]) -> Call:
    try:
        return Call(action, fn())
    except Exception as exc:  # noqa: BLE001 - the rules judge what the env raised
        return Call(action, error=exc)


def _pick_action(raw: Env, has_expert: bool, info: Any, rng: np.random.Generator, turn: int,
                 last: Call) -> str:
    """Mix expert moves, admissible moves and garbage so both valid and invalid paths run."""
    roll = rng.random()
    if roll < 0.1:
        return GARBAGE_ACTIONS[turn % len(GARBAGE_ACTIONS)]
    expert = _ask_expert(raw, last) if has_expert and roll < 0.55 else None
    if isinstance(expert, str):
        return expert
    actions = info.get("admissible_actions") if isinstance(info, dict) else None
    if isinstance(actions, list) and actions and all(isinstance(a, str) for a in actions):
        return actions[int(rng.integers(len(actions)))]
    expert = _ask_expert(raw, last) if has_expert else None
    return expert if isinstance(expert, str) else "look"


def _ask_expert(raw: Env, last: Call) -> Any:
    try:
        answer = raw.expert_action()
    except Exception as exc:  # noqa: BLE001 - check_expert reports it
        answer = exc
    last.expert.append(answer)
    return answer


def _canonical(call: Call) -> str:
    """A comparable form of a (type-checked) reset or step return."""
    if call.error is not None:
        return f"raised {type(call.error).__name__}: {call.error}"
    values = list(call.result)
    if call.action is not None:
        values[1:4] = [float(values[1]), bool(values[2]), bool(values[3])]
    return json.dumps(values, sort_keys=True)


def _same_calls(a: list[Call], b: list[Call], what: str, first_step: int = 0) -> None:
    """Raise naming the first call where ``a`` and ``b`` differ (``first_step``: the number of
    ``a[0]``'s step)."""
    # Not strict: the first differing call is the better report; a length mismatch is raised below.
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if _canonical(x) == _canonical(y):
            continue
        differ = "outcome"
        if x.error is None and y.error is None:
            names = ("observation", "info") if x.action is None else _STEP_FIELDS
            # Not strict: a broken env may answer tuples of another length; then "outcome" stands.
            differ = next((n for n, u, v in zip(names, x.result, y.result, strict=False) if u != v), differ)
        where = "reset()" if x.action is None else f"step {first_step + i}"
        raise _Broken(f"{what} differ at {where} in {differ}: {_canonical(x)[:200]!r} vs "
                      f"{_canonical(y)[:200]!r}")
    if len(a) != len(b):
        raise _Broken(f"{what} have different lengths ({len(a)} vs {len(b)} calls)")


# --- the rules -----------------------------------------------------------------------------------


class _Broken(Exception):
    """Raised inside a rule; ``_rule`` turns it into ``CheckFailed`` naming the rule."""


def _rule(fn: Rule) -> Rule:
    @functools.wraps(fn)
    def checked(run: CheckRun) -> None:
        try:
            fn(run)
        except _Broken as exc:
            raise CheckFailed(f"check_env: {fn.__name__}: {exc}", rule=fn.__name__) from exc.__cause__

    return checked


@_rule
def check_step_before_reset(run: CheckRun) -> None:
    """Rule: ``step()`` before the first ``reset()`` raises ``ResetNeeded``."""
    fresh = run.factory()
    try:
        fresh.step("anything")
    except ResetNeeded:
        return
    finally:
        fresh.close()
    raise _Broken("step() before reset() must raise ResetNeeded")


@_rule
def check_reset_returns(run: CheckRun) -> None:
    """Rule: ``reset()`` returns ``(observation: str, info: dict)`` and does not raise."""
    for where, call in run.calls:
        if call.action is not None:
            continue
        if call.error is not None:
            raise _Broken(f"{where} raised {type(call.error).__name__}: {call.error}") from call.error
        result = call.result
        if not isinstance(result, tuple) or len(result) != 2:
            raise _Broken(f"{where} must return (observation, info), got {result!r:.120}")
        if not isinstance(result[0], str):
            raise _Broken(f"{where} observation must be a str, got {type(result[0]).__name__}")
        if not isinstance(result[1], dict):
            raise _Broken(f"{where} info must be a dict, got {type(result[1]).__name__}")


@_rule
def check_step_returns(run: CheckRun) -> None:
    """Rule: ``step()`` returns ``(str, finite reward, bool, bool, dict)``."""
    for where, call in run.calls:
        if call.action is None or call.error is not None:
            continue
        result = call.result
        if not isinstance(result, tuple) or len(result) != 5:
            raise _Broken(f"{where} must return (observation, reward, terminated, truncated, info)")
        obs, reward, terminated, truncated, info = result
        if not isinstance(obs, str):
            raise _Broken(f"{where} observation must be a str, got {type(obs).__name__}")
        if (isinstance(reward, bool) or not isinstance(reward, (int, float, np.number))
                or not math.isfinite(reward)):
            raise _Broken(f"{where} reward must be a finite number, got {reward!r}")
        for name, flag in (("terminated", terminated), ("truncated", truncated)):
            if not isinstance(flag, (bool, np.bool_)):
                raise _Broken(f"{where} {name} must be a bool, got {flag!r}")
        if not isinstance(info, dict):
            raise _Broken(f"{where} info must be a dict, got {type(info).__name__}")


@_rule
def check_state_key(run: CheckRun) -> None:
    """Rule: every ``info`` has ``info["state_key"]``, a str."""
    for where, info in run.infos:
        if "state_key" not in info:
            raise _Broken(f"{where} info has no 'state_key'")
        if not isinstance(info["state_key"], str):
            raise _Broken(f"{where} info['state_key'] must be a str, got {info['state_key']!r:.80}")


#: The optional info keys of ``agentgym.core.INFO_KEYS`` whose values have a fixed type.
_TYPED_KEYS = {"task_id": str, "invalid_action": bool, "success": bool, "instructions": str}


@_rule
def check_info_types(run: CheckRun) -> None:
    """Rule: the optional ``info`` keys have their documented types (``agentgym.core.INFO_KEYS``)."""
    for where, info in run.infos:
        for key, kind in _TYPED_KEYS.items():
            if key in info and not isinstance(info[key], kind):
                raise _Broken(f"{where} info[{key!r}] must be a {kind.__name__}, got {info[key]!r:.80}")
        if "admissible_actions" in info:
            acts = info["admissible_actions"]
            if not isinstance(acts, list) or not all(isinstance(a, str) for a in acts):
                raise _Broken(f"{where} info['admissible_actions'] must be a list of str, got {acts!r:.80}")
        if "tools" in info:
            tools = info["tools"]
            if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
                raise _Broken(f"{where} info['tools'] must be a list of JSON-schema dicts")
            for tool in tools:
                fn = tool.get("function", tool)
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or "parameters" not in fn:
                    raise _Broken(f"{where} info['tools']: each tool needs a name and parameters: "
                                  f"{tool!r:.120}")


@_rule
def check_json_infos(run: CheckRun) -> None:
    """Rule: every ``info`` survives ``json.dumps`` (no NaN, no objects): the HTTP service sends it."""
    for where, info in run.infos:
        try:
            json.dumps(info, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise _Broken(f"{where} info does not survive json.dumps: {exc}") from None


@_rule
def check_step_answers(run: CheckRun) -> None:
    """Rule: ``step()`` answers every action, garbage included (``info["invalid_action"]``), never raises."""
    fix = "answer actions the env cannot parse or apply with an observation and info['invalid_action']=True"
    for where, call in run.calls:
        if call.error is not None and call.action is not None:
            raise _Broken(f"{where} raised {type(call.error).__name__}: {call.error}; {fix}") from call.error
    raw = run.other.unwrapped
    for garbage in GARBAGE_ACTIONS:
        raw.reset(seed=run.seed)
        step = _call(garbage, lambda g=garbage: raw.step(g))
        if step.error is not None:
            raise _Broken(f"step({garbage[:20]!r}) raised {type(step.error).__name__}: {step.error}; "
                          f"{fix}") from step.error


@_rule
def check_episode_ends(run: CheckRun) -> None:
    """Rule: every episode ends (terminated or truncated) within the turn budget."""
    for n, episode in enumerate(run.episodes):
        if not episode.ended and len(episode.calls) - 1 == run.limit:
            raise _Broken(f"episode {n} (seed {episode.seed}) still running after {run.limit} steps; "
                          "set max_turns")


@_rule
def check_step_after_end(run: CheckRun) -> None:
    """Rule: ``step()`` after the episode ended raises ``EpisodeFinished`` (until the next ``reset``)."""
    episode = run.episodes[0]
    env = run.env
    env.reset(seed=episode.seed, options=episode.options)
    for action in episode.actions:
        if env.episode_over:
            break
        env.step(action)
    if not env.episode_over:
        raise _Broken(f"replaying episode 0 through the guard did not end it after {env.turn} steps")
    try:
        env.step(episode.actions[-1] if episode.actions else "x")
    except EpisodeFinished:
        return
    raise _Broken("step() after the episode ended must raise EpisodeFinished")


@_rule
def check_determinism(run: CheckRun) -> None:
    """Rule: the same seed, options and actions give identical observations, rewards and infos."""
    for n, episode in enumerate(run.episodes):
        again = _record_episode(run.other, episode.seed, run.limit, options=episode.options,
                                actions=episode.actions)
        _same_calls(episode.calls, again.calls, f"episode {n} (seed {episode.seed}) and its replay")


@_rule
def check_task_id_replay(run: CheckRun) -> None:
    """Rule: ``reset(options={"task_id": info["task_id"]})`` with another seed starts the same task."""
    raw = run.other.unwrapped
    for episode in run.episodes:
        obs, info = episode.calls[0].result
        task_id = info.get("task_id")
        if task_id is None:
            continue
        seed = episode.seed + _OTHER_SEED
        try:
            again_obs, again_info = raw.reset(seed=seed, options={"task_id": task_id})
        except Exception as exc:  # an env that cannot replay its own task id breaks the rule
            raise _Broken(f"reset(seed={seed}, options={{'task_id': {task_id!r}}}) raised {exc!r}") from exc
        if again_obs != obs or not isinstance(again_info, dict) or again_info.get("task_id") != task_id:
            raise _Broken(f"reset(seed={seed}, options={{'task_id': {task_id!r}}}) did not replay the task "
                          f"(first observation or task_id differ). Fix: in reset, start the task named by "
                          f"options['task_id'] when it is given (whatever the seed), or leave task_id out of "
                          f"info if tasks cannot be named")


def _check_fork(run: CheckRun, mode: str) -> None:
    """Fork halfway through each recorded episode; the fork must continue exactly like the original. An env
    that declares itself unforkable (``Env.forkable = False``) must refuse with a ``ConfigError`` instead."""
    env = run.env
    if not getattr(env.unwrapped, "forkable", True):
        env.reset(seed=run.seed)
        try:
            env.fork(mode)  # type: ignore[arg-type]
        except ConfigError:
            return
        except AgentGymError as exc:
            raise _Broken(f"fork({mode!r}) of an unforkable env must raise ConfigError, got {exc!r}") from exc
        raise _Broken(f"the env says forkable = False, yet fork({mode!r}) made a copy")
    for n, episode in enumerate(run.episodes):
        actions = episode.actions
        if not actions:
            continue
        cut = len(actions) // 2
        env.reset(seed=episode.seed, options=episode.options)
        for action in actions[:cut]:
            env.step(action)
        try:
            child = env.fork(mode)  # type: ignore[arg-type]
        except AgentGymError as exc:
            raise _Broken(f"episode {n}: fork({mode!r}) after {cut} steps failed: {exc}") from exc
        try:
            if child.turn != env.turn:
                raise _Broken(f"a {mode} fork must carry its parent's turn count "
                              f"({child.turn} vs {env.turn})")
            traces: list[list[Call]] = [[], []]
            for action in actions[cut:]:
                for trace, member in zip(traces, (env, child), strict=True):
                    trace.append(_call(action, lambda m=member, a=action: m.step(a)))
            _same_calls(traces[0], traces[1], f"episode {n}: the original and its {mode} fork", cut + 1)
        finally:
            child.close()


@_rule
def check_fork_by_replay(run: CheckRun) -> None:
    """Rule: a fork by deterministic replay continues exactly like the original."""
    _check_fork(run, "replay")


@_rule
def check_fork_by_snapshot(run: CheckRun) -> None:
    """Rule: with ``snapshot``/``restore``, a fork by snapshot continues exactly like the original."""
    if run.env.supports_snapshot:
        _check_fork(run, "snapshot")


@_rule
def check_expert(run: CheckRun) -> None:
    """Rule: ``expert_action()`` returns a str or ``None`` and does not raise."""
    if not run.env.has_expert:
        return
    raw = run.other.unwrapped
    raw.reset(seed=run.seed)
    probe = Call(None)
    _ask_expert(raw, probe)
    for where, call in [*run.calls, ("after reset()", probe)]:
        for answer in call.expert:
            if isinstance(answer, Exception):
                raise _Broken(f"expert_action() {where} raised {answer!r}") from answer
            if answer is not None and not isinstance(answer, str):
                raise _Broken(f"expert_action() {where} must return a str or None, got {answer!r:.80}")


@_rule
def check_close_idempotent(run: CheckRun) -> None:
    """Rule: ``close()`` may be called twice, on a used env and on one never reset."""
    fresh = run.factory()
    for what, raw in (("a used env", run.other.unwrapped), ("an env never reset", fresh.unwrapped)):
        for attempt in ("first", "second"):
            try:
                raw.close()
            except Exception as exc:  # the rule is that close does not raise
                raise _Broken(f"the {attempt} close() of {what} raised {exc!r}") from exc


#: The rules ``check_env`` runs, in order: returned values first, then order, determinism, fork.
RULES: tuple[Rule, ...] = (
    check_step_before_reset,
    check_reset_returns,
    check_step_returns,
    check_state_key,
    check_info_types,
    check_json_infos,
    check_step_answers,
    check_episode_ends,
    check_determinism,
    check_step_after_end,
    check_task_id_replay,
    check_fork_by_replay,
    check_fork_by_snapshot,
    check_expert,
    check_close_idempotent,
)


# --- the entry point -----------------------------------------------------------------------------


def _factory_for(source: EnvSource) -> Callable[[], EpisodeGuard]:
    if isinstance(source, str):
        source = lookup_spec(source)
    if isinstance(source, EnvSpec):
        return functools.partial(make, source)
    if isinstance(source, EpisodeGuard):
        if source._factory is None:  # the checker is the guard's friend
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


def check_env(env: EnvSource, *, seed: int = 0, num_episodes: int = 3, max_steps: int = 200,
              gates: Sequence[Gate] = ()) -> None:
    """Check that an env honours the contract of ``agentgym.core.Env`` (and passes the given gates).

    Records ``num_episodes`` seeded episodes, then runs each function of ``RULES`` in order (each
    one's docstring states its rule): reset and step return types; ``state_key`` present and a str;
    the optional info keys typed; infos JSON-safe; every action answered, never raised; episodes end
    within the turn budget; ``step`` before ``reset`` and after the end raise; determinism under
    seed, options and actions; ``task_id`` replays the task; forks by replay and by snapshot continue
    like the original; the expert answers a str or ``None``; ``close`` is idempotent. Then each of
    ``gates`` (``GATES``: the expert solves the checked tasks, random and do-nothing policies score
    below it, privileged answers stay hidden, seeds pick tasks repeatably, rewards stay in the declared
    range); ``agentgym.gates.grade_env`` runs every gate and reports each instead of raising.

    Args:
        env: an env id, an ``EnvSpec``, an env made by ``agentgym.make``, or a zero-argument
            factory returning an ``agentgym.Env``.
        seed: first episode seed; episode ``i`` uses ``seed + i``.
        num_episodes: episodes driven with a seeded mix of expert, admissible and garbage actions;
            the gates play the same seeds.
        max_steps: cap for envs without ``max_turns``; an episode still running then fails the check.
        gates: quality gates to run after the rules, in order (none by default;
            ``agentgym.gates.GATES`` for all).

    Raises:
        CheckFailed: the first broken rule or gate; ``.rule`` is its function's name.

    Example:
        >>> from agentgym.examples import EchoEnv
        >>> from agentgym.gates import GATES
        >>> check_env(lambda: EchoEnv(target="hi"), gates=GATES)
        >>> class Forgetful(EchoEnv):
        ...     def reset(self, *, seed=None, options=None):
        ...         return "Say something.", {}
        >>> try:
        ...     check_env(Forgetful)
        ... except CheckFailed as exc:
        ...     print(exc.rule)
        check_state_key
    """
    run = CheckRun.start(env, seed=seed, num_episodes=num_episodes, max_steps=max_steps)
    try:
        for rule in RULES:
            rule(run)
        for gate in gates:
            gate(run)
    finally:
        run.close()
