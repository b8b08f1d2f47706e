"""``check_env``: the text-env contract as code, one function per rule, then the quality gates.

``check_env`` builds the env, records a few seeded episodes of it (expert, admissible and garbage
actions mixed, so valid and invalid paths both run) and calls every rule in ``RULES`` in order; the
first broken rule raises ``CheckFailed`` with ``.rule`` set to its function's name. The rules that
judge returned values read what the *unwrapped* env returned, so a missing ``state_key`` is reported
by ``check_state_key`` rather than by whichever ``EpisodeGuard`` check trips first; the rules about
order and fork drive the guarded env, as users do.

The quality gates in ``GATES`` go beyond the contract: they play the checked seeds with three
policies (``POLICIES``: the expert, a random policy and a do-nothing policy) on an instance of their
own and judge the env as a training task: the expert solves it, baselines score below the expert,
the privileged answer stays out of what the agent sees, the seed picks the task, rewards stay in the
declared range. ``check_env(env, gates=GATES)`` runs them after the rules (they are opt-in there: a
configuration may make a task easy or its expert imperfect, and the contract holds either way);
``grade_env`` and ``agentgym check`` run every gate, even after one fails, and report each, with the
policies' mean returns.
"""
from __future__ import annotations

import contextlib
import functools
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentgym.core import INFO_KEYS, SAMPLE_CHARS, Env
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
    """The gates' episodes by policy name (``POLICIES``), one per checked seed, recorded by ``play``."""
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

    def play(self, policy: str) -> list[Episode]:
        """The episodes ``POLICIES[policy]`` plays on the checked seeds (played once, then cached).

        They run on ``gate_env``, a third instance, each from a ``reset`` with the seed and options of
        the recorded episode and a policy rng seeded by the seed, so they are as repeatable as the env.
        """
        if policy not in self.played:
            if self.gate_env is None:
                self.gate_env = self.factory()
            choose = POLICIES[policy]
            self.played[policy] = [
                _record_episode(self.gate_env, ep.seed, self.limit, options=ep.options, policy=choose,
                                rng=np.random.default_rng([ep.seed, 1 + list(POLICIES).index(policy)]))
                for ep in self.episodes
            ]
        return self.played[policy]

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


# --- the quality gates ----------------------------------------------------------------------------

#: The do-nothing policy's action: no env means it, so every step answers it as invalid (or ignores it).
NOOP_ACTION = "<no-op>"
#: Gate 2's margin: each baseline's mean return must be at least this fraction of
#: ``max(1, |expert mean return|)`` below the expert's.
MIN_RETURN_GAP = 0.1
#: Gate 3 looks for privileged values of at least this many characters (shorter ones, "1" or "no",
#: occur in any text by chance), and only as whole words: "42" leaks in "it is 42", not in "1420".
MIN_LEAK_CHARS = 3
#: The ``INFO_KEYS`` whose values prompts must never show (their description says "privileged").
PRIVILEGED_KEYS: tuple[str, ...] = tuple(k for k, text in INFO_KEYS.items() if text.startswith("privileged"))
#: The ``info`` keys whose text the prompt renderer shows the policy (admissible actions aside: a choice
#: among options names the right one by design).
_PROMPT_KEYS = ("instructions", "tools")


def expert_policy(raw: Env, info: Any, rng: np.random.Generator, last: Call) -> str:
    """The env's expert (``expert_action()``); where it has no move, the do-nothing action."""
    answer = _ask_expert(raw, last)
    return answer if isinstance(answer, str) else NOOP_ACTION


def random_policy(raw: Env, info: Any, rng: np.random.Generator, last: Call) -> str:
    """A uniformly drawn ``info["admissible_actions"]`` entry where the env lists them, else a random
    string of 1-32 printable characters."""
    actions = info.get("admissible_actions") if isinstance(info, dict) else None
    if isinstance(actions, list) and actions and all(isinstance(a, str) for a in actions):
        return actions[int(rng.integers(len(actions)))]
    length = int(rng.integers(1, 33))
    return "".join(SAMPLE_CHARS[i] for i in rng.integers(len(SAMPLE_CHARS), size=length))


def noop_policy(raw: Env, info: Any, rng: np.random.Generator, last: Call) -> str:
    """Always ``NOOP_ACTION``."""
    return NOOP_ACTION


#: The gates' policies by name.
POLICIES: dict[str, Policy] = {"expert": expert_policy, "random": random_policy, "do-nothing": noop_policy}


def episode_return(episode: Episode) -> float:
    """The sum of the rewards of an episode's steps that returned.

    Example:
        >>> episode_return(Episode(0, None, [Call(None), Call("a", ("", 0.5, False, False, {})),
        ...                                  Call("b", ("", 1.0, True, False, {}))], ended=True))
        1.5
    """
    return sum(float(c.result[1]) for c in episode.calls[1:]
               if c.error is None and isinstance(c.result, tuple) and len(c.result) == 5)


def mean_returns(run: CheckRun) -> dict[str, float]:
    """Each policy's mean return over the checked seeds (the expert's only where the env has one)."""
    names = [name for name in POLICIES if name != "expert" or run.env.has_expert]
    return {name: float(np.mean([episode_return(ep) for ep in run.play(name)])) for name in names}


def declared_reward_range(raw: Env) -> tuple[float, float] | None:
    """The env's declared ``(low, high)`` reward per step, or ``None`` where it declares none.

    Read from the ``reward_range`` attribute (Gymnasium before 1.0 had one on every env) or from
    ``metadata["reward_range"]``. An unbounded default ``(-inf, inf)`` declares nothing.

    Raises:
        CheckFailed: the declaration is not two numbers with ``low <= high`` (``rule`` is
            ``gate_reward_range``).

    Example:
        >>> from agentgym.examples import EchoEnv
        >>> env = EchoEnv()
        >>> declared_reward_range(env) is None
        True
        >>> env.metadata = {**env.metadata, "reward_range": (0, 1)}
        >>> declared_reward_range(env)
        (0.0, 1.0)
    """
    declared = getattr(raw, "reward_range", None)
    if declared is None:
        metadata = getattr(raw, "metadata", None)
        declared = metadata.get("reward_range") if isinstance(metadata, dict) else None
    if declared is None:
        return None
    try:
        low, high = (float(bound) for bound in declared)
    except (TypeError, ValueError):
        low = high = math.nan
    if not low <= high:  # also catches NaN
        raise CheckFailed(f"check_env: gate_reward_range: reward_range must be (low, high) numbers with "
                          f"low <= high, got {declared!r:.80}; fix the env's declaration",
                          rule="gate_reward_range")
    if low == -math.inf and high == math.inf:
        return None
    return low, high


def _expert_solves_every_task(run: CheckRun) -> bool:
    """The env's ``expert_solves_every_task`` (class or instance attribute; ``True`` when absent)."""
    return bool(getattr(run.env.unwrapped, "expert_solves_every_task", True))


def _steps(episode: Episode) -> list[tuple[int, Call]]:
    """The steps that returned a well-formed 5-tuple, numbered from 1."""
    return [(i, c) for i, c in enumerate(episode.calls) if i > 0 and c.error is None
            and isinstance(c.result, tuple) and len(c.result) == 5]


def _gate(fn: Gate) -> Gate:
    @functools.wraps(fn)
    def checked(run: CheckRun) -> str:
        try:
            return fn(run)
        except _Broken as exc:
            raise CheckFailed(f"check_env: {fn.__name__}: {exc}", rule=fn.__name__) from exc.__cause__

    return checked


@_gate
def gate_expert_reaches_max_reward(run: CheckRun) -> str:
    """Gate: the expert solves every checked task (or, declared imperfect, ends each one validly).

    "Solves" is the final ``info["success"]`` where the env reports one; else, with a declared reward
    range, a terminating step paying its maximum; else a terminated episode whose return is at least
    every baseline's on that seed; so the episode must terminate (a truncated one ran out of turns).
    Either way every expert action must be valid. An env whose expert is good but not perfect by design
    (a card game's odds, a draw against a perfect opponent) declares ``expert_solves_every_task = False``,
    as a class attribute, or an instance attribute set in ``__init__`` where its arguments decide
    (slippery ice, fewer guesses); then only valid actions are required here.
    """
    if not run.env.has_expert:
        return "skipped: the env has no expert"
    must_solve = _expert_solves_every_task(run)
    reward_range = declared_reward_range(run.env.unwrapped)
    solved = 0
    for n, episode in enumerate(run.play("expert")):
        where = f"expert episode {n} (seed {episode.seed})"
        steps = _steps(episode)
        if not steps or len(steps) != len(episode.calls) - 1:
            raise _Broken(f"{where} did not play to the end ({len(steps)} steps returned); "
                          "check_env's contract rules say why")
        for i, call in steps:
            asked = episode.calls[i - 1].expert
            if not asked or not isinstance(asked[-1], str):
                raise _Broken(f"{where}: expert_action() had no move before step {i} (it returned "
                              f"{asked[-1] if asked else None!r:.60}); give the expert a move in every state")
            if call.info.get("invalid_action") is True:
                raise _Broken(f"{where}: the expert's action at step {i} ({call.action[:40]!r}) was invalid; "
                              "make expert_action() return an action the env accepts")
        _, final = steps[-1]
        _, reward, terminated, _, info = final.result
        if not terminated:
            won = False
            if must_solve:
                raise _Broken(f"{where} did not terminate within {run.limit} steps; make the expert finish "
                              "the task (or raise the env's max_turns)")
        elif "success" in info:
            won = info["success"] is True
        elif reward_range is not None:
            won = float(reward) >= reward_range[1]
        else:
            baselines = [run.play(name)[n] for name in POLICIES if name != "expert"]
            won = episode_return(episode) >= max(episode_return(other) for other in baselines)
        solved += won
        if must_solve and not won:
            raise _Broken(f"{where} ended unsolved (return {episode_return(episode):g}); fix the expert, or "
                          "declare expert_solves_every_task = False on an env whose expert is imperfect by "
                          "design")
    total = len(run.episodes)
    declared = "" if must_solve else " (declared imperfect: expert_solves_every_task = False)"
    return f"expert solved {solved}/{total} checked tasks{declared}"


@_gate
def gate_baseline_below_expert(run: CheckRun) -> str:
    """Gate: the random and do-nothing policies' mean returns are ``MIN_RETURN_GAP`` below the expert's.

    "Measurably below": the gap must be at least ``MIN_RETURN_GAP`` × ``max(1, |expert mean|)``, means
    taken over the checked seeds (the same tasks for every policy). Applies where the env has an expert
    that solves every task; an imperfect expert's edge is statistical and needs more episodes than a
    check plays.
    """
    if not run.env.has_expert:
        return "skipped: the env has no expert"
    means = mean_returns(run)
    summary = ", ".join(f"{name} {value:.3g}" for name, value in means.items())
    if not _expert_solves_every_task(run):
        return f"skipped: the expert is declared imperfect (mean returns: {summary})"
    expert = means.pop("expert")
    needed = MIN_RETURN_GAP * max(1.0, abs(expert))
    for name, value in means.items():
        if expert - value < needed:
            raise _Broken(f"the {name} policy's mean return {value:.3g} is not {needed:.3g} below the "
                          f"expert's {expert:.3g} over seeds {run.seeds}; make the task need skill (reward "
                          f"only solving it, end failed episodes) or fix the expert")
    return f"mean returns: {summary}"


def _privileged_values(infos: list[Any]) -> list[str]:
    """The texts of the privileged ``info`` values (strings and numbers, nested in lists and dicts)
    with at least ``MIN_LEAK_CHARS`` characters."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)
        elif isinstance(value, (str, int, float)) and not isinstance(value, bool):
            text = str(value).strip()
            if len(text) >= MIN_LEAK_CHARS and text not in found:
                found.append(text)

    for info in infos:
        if isinstance(info, dict):
            for key in PRIVILEGED_KEYS:
                walk(info.get(key))
    return found


def _shown_texts(episode: Episode, *, every_observation: bool) -> list[tuple[str, str]]:
    """What the agent sees in an episode without earning it, labelled: the first observation, the
    prompt text of every info (``_PROMPT_KEYS``), and the non-final observations answering actions the
    env called invalid (with ``every_observation``, every non-final observation)."""
    shown: list[tuple[str, str]] = []
    last = len(episode.calls) - 1
    for i, call in enumerate(episode.calls):
        if call.error is not None or not isinstance(call.result, tuple) or not isinstance(call.info, dict):
            continue
        where = "reset()" if i == 0 else f"step {i}"
        info = call.info
        for key in _PROMPT_KEYS:
            if key in info:
                text = info[key] if isinstance(info[key], str) else json.dumps(info[key], default=str)
                shown.append((f"{where} info[{key!r}]", text))
        unearned = i == 0 or (i < last and (every_observation or info.get("invalid_action") is True))
        if isinstance(call.result[0], str) and unearned:
            shown.append((f"{where} observation", call.result[0]))
    return shown


@_gate
def gate_answer_not_leaked(run: CheckRun) -> str:
    """Gate: no privileged ``info`` value (``PRIVILEGED_KEYS``) shows in what the agent sees unearned.

    Checked text, in every episode played (the contract's and each policy's): the first observation;
    the instructions and tool specs of every info; the observations answering actions the env called
    invalid; and every observation of the do-nothing policy, which asks for nothing. The final
    observation is not checked (the episode is over), nor replies to valid actions: a search may find
    the answer, a tool may print it, and admissible actions may list it among the choices. A value
    matches as a whole word, ignoring case, and only values of at least ``MIN_LEAK_CHARS`` characters
    are sought.
    """
    labelled = [(f"episode {n} (seed {ep.seed})", ep, False) for n, ep in enumerate(run.episodes)]
    labelled += [(f"{name} episode {n} (seed {ep.seed})", ep, name == "do-nothing")
                 for name in POLICIES if name != "expert" or run.env.has_expert
                 for n, ep in enumerate(run.play(name))]
    with_secrets = 0
    for label, episode, every_observation in labelled:
        secrets = _privileged_values([call.info for call in episode.calls])
        with_secrets += bool(secrets)
        for secret in secrets:
            pattern = re.compile(rf"(?<!\w){re.escape(secret)}(?!\w)", re.IGNORECASE)
            for where, text in _shown_texts(episode, every_observation=every_observation):
                if pattern.search(text):
                    raise _Broken(f"{label}: the privileged value {secret[:60]!r} shows in the {where}; keep "
                                  f"{', '.join(PRIVILEGED_KEYS)} out of observations and prompt text")
    if not with_secrets:
        return "skipped: no privileged values in info"
    return f"privileged values of {with_secrets}/{len(labelled)} episodes never shown unearned"


def _task(call: Call) -> str:
    """The task a reset started: its first observation and info, canonical."""
    return _canonical(call)


@_gate
def gate_same_seed_same_task(run: CheckRun) -> str:
    """Gate: a seed starts the same task on every reset and instance; seeds pick different tasks.

    Each checked seed's first observation and info, as recorded, must match every reset of the
    gates' separately made instance with that seed (one per policy played). Where the env names its
    tasks (``info["task_id"]``), more than half of the checked seeds must start distinct tasks: a pool
    of N tasks may repeat one, an env that ignores the seed repeats them all.
    """
    for name in POLICIES:
        if name == "expert" and not run.env.has_expert:
            continue
        for episode, again in zip(run.episodes, run.play(name), strict=True):
            first, second = _task(episode.calls[0]), _task(again.calls[0])
            if first != second:
                raise _Broken(f"reset(seed={episode.seed}) on a second instance (before the {name} episode) "
                              f"started another task: {first[:120]!r} vs {second[:120]!r}; pick the task "
                              "from the seed and options only (self.np_random, no global state)")
    tasks = [_task(episode.calls[0]) for episode in run.episodes]
    named = any(isinstance(ep.calls[0].info, dict) and "task_id" in ep.calls[0].info for ep in run.episodes)
    distinct = len(set(tasks))
    if named and distinct * 2 <= len(tasks):
        raise _Broken(f"seeds {run.seeds} started only {distinct} distinct tasks; pick the task from the "
                      "seed (the same task for every seed is a fixed task: then report no task_id)")
    return f"{distinct} distinct tasks over seeds {run.seeds}" + ("" if named else " (no task_id)")


@_gate
def gate_reward_range(run: CheckRun) -> str:
    """Gate: every reward lies within the env's declared reward range (``declared_reward_range``)."""
    reward_range = declared_reward_range(run.env.unwrapped)
    if reward_range is None:
        return "skipped: the env declares no reward range"
    low, high = reward_range
    played = [(f"{name} episode {n}", ep) for name in POLICIES if name != "expert" or run.env.has_expert
              for n, ep in enumerate(run.play(name))]
    for label, episode in [*((f"episode {n}", ep) for n, ep in enumerate(run.episodes)), *played]:
        for i, call in _steps(episode):
            reward = call.result[1]
            if isinstance(reward, (int, float, np.number)) and not low <= float(reward) <= high:
                raise _Broken(f"{label} (seed {episode.seed}) step {i} paid {reward!r}, outside the declared "
                              f"reward_range ({low:g}, {high:g}); fix the reward or the declaration")
    return f"every reward within ({low:g}, {high:g})"


#: The quality gates ``check_env`` runs after ``RULES`` (each one's docstring states it).
GATES: tuple[Gate, ...] = (
    gate_expert_reaches_max_reward,
    gate_baseline_below_expert,
    gate_answer_not_leaked,
    gate_same_seed_same_task,
    gate_reward_range,
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
    range); ``grade_env`` runs every gate and reports each instead of raising.

    Args:
        env: an env id, an ``EnvSpec``, an env made by ``agentgym.make``, or a zero-argument
            factory returning an ``agentgym.Env``.
        seed: first episode seed; episode ``i`` uses ``seed + i``.
        num_episodes: episodes driven with a seeded mix of expert, admissible and garbage actions;
            the gates play the same seeds.
        max_steps: cap for envs without ``max_turns``; an episode still running then fails the check.
        gates: quality gates to run after the rules, in order (none by default; ``GATES`` for all).

    Raises:
        CheckFailed: the first broken rule or gate; ``.rule`` is its function's name.

    Example:
        >>> from agentgym.examples import EchoEnv
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


@dataclass(frozen=True)
class GateResult:
    """One gate's verdict on an env."""

    gate: str
    """The gate function's name."""
    passed: bool
    """The gate held (or did not apply: then ``message`` starts with ``"skipped"``)."""
    message: str
    """What it measured, or the failure with its fix."""


@dataclass(frozen=True)
class EnvGrade:
    """``grade_env``'s report: every gate's verdict and the policies' mean returns."""

    results: list[GateResult]
    """One per gate, in the order run."""
    mean_returns: dict[str, float]
    """Mean return over the checked seeds by policy name (``POLICIES``; no ``"expert"`` without one)."""

    @property
    def passed(self) -> bool:
        """Every gate held."""
        return all(result.passed for result in self.results)


def grade_env(env: EnvSource, *, seed: int = 0, num_episodes: int = 3, max_steps: int = 200,
              gates: Sequence[Gate] = GATES) -> EnvGrade:
    """Check the contract (as ``check_env``), then run *every* gate and report each verdict.

    Unlike ``check_env``, a failing gate does not stop the others: the report lists them all.

    Args:
        env: as for ``check_env``.
        seed: first seed checked; seed ``i`` is ``seed + i``.
        num_episodes: seeds checked (contract episodes and each policy's gate episodes).
        max_steps: as for ``check_env``.
        gates: the gates to run, in order.

    Returns:
        The gates' verdicts and each policy's mean return.

    Raises:
        CheckFailed: a contract rule broke (gates over a broken contract would judge nothing).

    Example:
        >>> from agentgym.examples import EchoEnv
        >>> grade = grade_env(lambda: EchoEnv(target="hi"))
        >>> grade.passed, grade.mean_returns
        (True, {'expert': 1.0, 'random': 0.0, 'do-nothing': 0.0})
        >>> [result.message for result in grade.results][:2]
        ['expert solved 3/3 checked tasks', 'mean returns: expert 1, random 0, do-nothing 0']
    """
    run = CheckRun.start(env, seed=seed, num_episodes=num_episodes, max_steps=max_steps)
    try:
        for rule in RULES:
            rule(run)
        results = []
        for gate in gates:
            try:
                results.append(GateResult(gate.__name__, True, gate(run)))
            except CheckFailed as exc:
                results.append(GateResult(gate.__name__, False, str(exc).split(": ", 2)[-1]))
        return EnvGrade(results, mean_returns(run))
    finally:
        run.close()
