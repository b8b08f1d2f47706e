"""Quality gates: does an env make a good training task, beyond honouring the contract?

The gates in ``GATES`` play the seeds ``check_env`` checked with three policies (``POLICIES``: the
expert, a random policy and a do-nothing policy) on an instance of their own and judge the env as a
task: the expert solves it, baselines score below the expert, the privileged answer stays out of what
the agent sees, the seed picks the task, rewards stay in the declared range. Each gate is one function
that raises ``CheckFailed`` naming itself with a one-line fix, or returns a note of what it measured, or,
where it does not apply (no expert, no declared reward range...), a ``Skipped`` note saying why and what
would enable it: a skipped gate is reported apart, never counted as passed.
``check_env(env, gates=GATES)`` runs them after the contract rules (opt-in there: a configuration may
make a task easy or its expert imperfect, and the contract holds either way); ``grade_env`` and
``agentgym check`` run every gate, even after one fails, and report each with the policies' mean returns.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentgym.checker import (
    RULES,
    Call,
    CheckRun,
    EnvSource,
    Episode,
    Gate,
    Policy,
    _ask_expert,
    _Broken,
    _canonical,
    _record_episode,
)
from agentgym.core import INFO_KEYS, SAMPLE_CHARS, Env
from agentgym.errors import CheckFailed

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


class Skipped(str):
    """A gate's note that it did not apply to the env: the text ``"skipped: <reason>"``.

    A gate returns one instead of a measurement; ``grade_env`` then reports the gate as skipped (neither
    passed nor failed), and ``check_env`` ignores it as it ignores every note.

    Example:
        >>> note = Skipped("the env declares no reward range")
        >>> note, note.reason
        ('skipped: the env declares no reward range', 'the env declares no reward range')
    """

    __slots__ = ()

    def __new__(cls, reason: str) -> Skipped:
        return super().__new__(cls, f"skipped: {reason}")

    @property
    def reason(self) -> str:
        """Why the gate did not apply (and what would make it apply)."""
        return self.removeprefix("skipped: ")


#: Why the expert gates skip an env without an expert, and how to enable them.
NO_EXPERT = "the env has no expert (define expert_action() to enable the expert gates)"


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
    return {name: float(np.mean([episode_return(ep) for ep in play(run, name)])) for name in names}


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
        return Skipped(NO_EXPERT)
    must_solve = _expert_solves_every_task(run)
    reward_range = declared_reward_range(run.env.unwrapped)
    solved = 0
    for n, episode in enumerate(play(run, "expert")):
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
            baselines = [play(run, name)[n] for name in POLICIES if name != "expert"]
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
        return Skipped(NO_EXPERT)
    means = mean_returns(run)
    summary = ", ".join(f"{name} {value:.3g}" for name, value in means.items())
    if not _expert_solves_every_task(run):
        return Skipped(f"the expert is declared imperfect, expert_solves_every_task = False; its edge needs "
                       f"more episodes than a check plays (mean returns: {summary})")
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
                 for n, ep in enumerate(play(run, name))]
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
        return Skipped("no privileged values in info (an env with a ground-truth answer puts it in "
                       "info['answer'] to enable this gate)")
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
        for episode, again in zip(run.episodes, play(run, name), strict=True):
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
        return Skipped("the env declares no reward range (declare reward_range = (low, high) to enable "
                       "this gate)")
    low, high = reward_range
    played = [(f"{name} episode {n}", ep) for name in POLICIES if name != "expert" or run.env.has_expert
              for n, ep in enumerate(play(run, name))]
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


def play(run: CheckRun, policy: str) -> list[Episode]:
        """The episodes ``POLICIES[policy]`` plays on the checked seeds (played once, then cached).

        They run on ``gate_env``, a third instance, each from a ``reset`` with the seed and options of
        the recorded episode and a policy rng seeded by the seed, so they are as repeatable as the env.
        """
        if policy not in run.played:
            if run.gate_env is None:
                run.gate_env = run.factory()
            choose = POLICIES[policy]
            run.played[policy] = [
                _record_episode(run.gate_env, ep.seed, run.limit, options=ep.options, policy=choose,
                                rng=np.random.default_rng([ep.seed, 1 + list(POLICIES).index(policy)]))
                for ep in run.episodes
            ]
        return run.played[policy]


@dataclass(frozen=True)
class GateResult:
    """One gate's verdict on an env."""

    gate: str
    """The gate function's name."""
    passed: bool
    """The gate held (False when it failed or was skipped)."""
    message: str
    """What it measured, the failure with its fix, or (skipped) ``"skipped: <why>"``."""
    skipped: bool = False
    """The gate did not apply to this env (``message`` says why and what would enable it): neither passed
    nor failed."""


@dataclass(frozen=True)
class EnvGrade:
    """``grade_env``'s report: every gate's verdict and the policies' mean returns."""

    results: list[GateResult]
    """One per gate, in the order run."""
    mean_returns: dict[str, float]
    """Mean return over the checked seeds by policy name (``POLICIES``; no ``"expert"`` without one)."""

    @property
    def passed(self) -> bool:
        """No gate failed (skipped gates neither pass nor fail)."""
        return not self.failed

    @property
    def failed(self) -> list[GateResult]:
        """The gates that failed."""
        return [result for result in self.results if not result.passed and not result.skipped]

    @property
    def skipped(self) -> list[GateResult]:
        """The gates that did not apply to this env."""
        return [result for result in self.results if result.skipped]


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
        >>> [result.gate for result in grade.skipped]  # EchoEnv has no answer and no reward range
        ['gate_answer_not_leaked', 'gate_reward_range']
    """
    run = CheckRun.start(env, seed=seed, num_episodes=num_episodes, max_steps=max_steps)
    try:
        for rule in RULES:
            rule(run)
        results = []
        for gate in gates:
            try:
                note = gate(run)
                skipped = isinstance(note, Skipped)
                results.append(GateResult(gate.__name__, not skipped, note, skipped))
            except CheckFailed as exc:
                results.append(GateResult(gate.__name__, False, str(exc).split(": ", 2)[-1]))
        return EnvGrade(results, mean_returns(run))
    finally:
        run.close()
