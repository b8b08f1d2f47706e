"""check_env must pass honest envs and catch each way an env can break the contract."""

from __future__ import annotations

import dataclasses
import pickle
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env as gymnasium_check_env

import agentgym
from agentgym import checker
from agentgym.core import Env
from agentgym.errors import CheckFailed, EpisodeFinished, ResetNeeded
from agentgym.examples import EchoEnv
from agentgym.guard import EpisodeGuard
from agentgym.harness.examples import arithmetic_tasks


class WalkEnv(Env):
    """A 1-D walk to position 3 with a snapshot; subclasses break one rule each."""

    supports_snapshot = True
    has_expert = True

    def __init__(self) -> None:
        self.pos = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.pos = 0
        return self._obs(), self._info()

    def _obs(self) -> str:
        return f"at {self.pos}"

    def _info(self) -> dict[str, Any]:
        return {"state_key": str(self.pos), "admissible_actions": ["left", "right"]}

    def step(self, action: str):
        if action not in ("left", "right"):
            return "unknown action", 0.0, False, False, {**self._info(), "invalid_action": True}
        self.pos += 1 if action == "right" else -1
        done = self.pos == 3
        return self._obs(), float(done), done, False, {**self._info(), "success": done}

    def expert_action(self) -> str | None:
        return "right"

    def snapshot(self) -> bytes:
        return pickle.dumps(self.pos)

    def restore(self, data: bytes) -> None:
        self.pos = pickle.loads(data)


class NoisyEnv(WalkEnv):
    """Non-deterministic: uses the global clock instead of np_random."""

    def _obs(self) -> str:
        import time

        return f"at {self.pos} t={time.perf_counter_ns()}"


class NoStateKeyEnv(WalkEnv):
    def _info(self) -> dict[str, Any]:
        return {"admissible_actions": ["left", "right"]}


class NonJsonInfoEnv(WalkEnv):
    def _info(self) -> dict[str, Any]:
        return {"state_key": str(self.pos), "blob": object()}


class BadToolsEnv(WalkEnv):
    def _info(self) -> dict[str, Any]:
        return {"state_key": str(self.pos), "tools": [{"description": "no name"}]}


class RaisesOnGarbageEnv(WalkEnv):
    def step(self, action: str):
        if action not in ("left", "right"):
            raise ValueError(f"cannot parse {action!r}")
        return super().step(action)


class BrokenSnapshotEnv(WalkEnv):
    def restore(self, data: bytes) -> None:
        self.pos = pickle.loads(data) + 1  # off by one


class NeverEndsEnv(WalkEnv):
    def step(self, action: str):
        obs, reward, _, truncated, info = super().step(action)
        return obs, reward, False, truncated, info


class BadAdmissibleEnv(WalkEnv):
    def _info(self) -> dict[str, Any]:
        return {"state_key": str(self.pos), "admissible_actions": "left,right"}


class NumericTaskIdEnv(WalkEnv):
    def _info(self) -> dict[str, Any]:
        return {"state_key": str(self.pos), "task_id": 7}


class ListObservationEnv(WalkEnv):
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = super().reset(seed=seed, options=options)
        return [obs], info


class NanRewardEnv(WalkEnv):
    def step(self, action: str):
        obs, _, terminated, truncated, info = super().step(action)
        return obs, float("nan"), terminated, truncated, info


class IgnoresTaskIdEnv(WalkEnv):
    """Names its task but picks it from the seed alone, so ``task_id`` cannot replay it."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.pos = int(self.np_random.integers(-2, 3))
        return self._obs(), {**self._info(), "task_id": f"walk/{self.pos}"}


class NumericExpertEnv(WalkEnv):
    def expert_action(self):  # deliberately the wrong type
        return 1


class ClosesOnceEnv(WalkEnv):
    def close(self) -> None:
        if getattr(self, "closed", False):
            raise RuntimeError("already closed")
        self.closed = True


class StepsBeforeResetGuard(EpisodeGuard):
    """A guard that lets a step through before reset (no ResetNeeded)."""

    def step(self, action: str):
        if not self._started:
            return "not started", 0.0, False, False, {"state_key": "none"}
        return super().step(action)


class StepsAfterEndGuard(EpisodeGuard):
    """A guard that answers steps after the episode ended instead of raising EpisodeFinished."""

    def step(self, action: str):
        try:
            return super().step(action)
        except EpisodeFinished:
            return "over", 0.0, True, False, {"state_key": "over"}


class ForgetfulForkGuard(EpisodeGuard):
    """A guard whose replay forks forget the action prefix."""

    def _replay(self, seed: int | None, options: dict[str, Any] | None, actions: list[str]) -> None:
        super()._replay(seed, options, actions[:-1])


def _spec(cls: type[Env], max_turns: int | None = 8) -> str:
    env_id = f"test/{cls.__name__.lower()}-v0"
    agentgym.register(env_id, cls, max_turns=max_turns, override=True)
    return env_id


def _guarded(guard_cls: type[EpisodeGuard]) -> Callable[[], EpisodeGuard]:
    def factory() -> EpisodeGuard:
        return guard_cls(WalkEnv(), max_turns=8, factory=factory)

    return factory


def test_honest_envs_pass() -> None:
    agentgym.check_env(_spec(WalkEnv))
    agentgym.check_env(lambda: EchoEnv())
    agentgym.check_env(agentgym.make(_spec(WalkEnv)))
    agentgym.check_env(agentgym.EnvSpec("test/unregistered-walk-v0", WalkEnv, max_turns=8))
    agentgym.check_env(_guarded(EpisodeGuard))


@pytest.mark.parametrize(
    "source, rule",
    [
        (_guarded(StepsBeforeResetGuard), "check_step_before_reset"),
        (ListObservationEnv, "check_reset_returns"),
        (NanRewardEnv, "check_step_returns"),
        (NoStateKeyEnv, "check_state_key"),
        (BadToolsEnv, "check_info_types"),
        (BadAdmissibleEnv, "check_info_types"),
        (NumericTaskIdEnv, "check_info_types"),
        (NonJsonInfoEnv, "check_json_infos"),
        (RaisesOnGarbageEnv, "check_step_answers"),
        (NoisyEnv, "check_determinism"),
        (_guarded(StepsAfterEndGuard), "check_step_after_end"),
        (IgnoresTaskIdEnv, "check_task_id_replay"),
        (_guarded(ForgetfulForkGuard), "check_fork_by_replay"),
        (BrokenSnapshotEnv, "check_fork_by_snapshot"),
        (NumericExpertEnv, "check_expert"),
        (ClosesOnceEnv, "check_close_idempotent"),
    ],
    ids=lambda v: v if isinstance(v, str) else getattr(v, "__name__", "guarded"),
)
def test_each_broken_rule_is_caught_by_its_rule(source: Any, rule: str) -> None:
    env = _spec(source) if isinstance(source, type) else source
    with pytest.raises(CheckFailed, match=rule) as caught:
        agentgym.check_env(env)
    assert caught.value.rule == rule
    assert isinstance(caught.value, agentgym.EnvContractError)


def test_episode_that_never_ends_without_budget_is_caught() -> None:
    with pytest.raises(CheckFailed, match="still running after 20 steps") as caught:
        agentgym.check_env(_spec(NeverEndsEnv, max_turns=None), max_steps=20)
    assert caught.value.rule == "check_episode_ends"


def test_every_rule_is_a_named_function_with_a_one_line_rule() -> None:
    names = [rule.__name__ for rule in checker.RULES]
    defined = [name for name in vars(checker) if name.startswith("check_") and name != "check_env"]
    assert sorted(names) == sorted(defined) and len(set(names)) == len(names)
    for rule in checker.RULES:
        doc = rule.__doc__ or ""
        assert doc.startswith("Rule: ") and "\n" not in doc.strip(), rule.__name__


def test_a_rule_can_run_on_its_own() -> None:
    run = checker.CheckRun.start(_spec(WalkEnv), num_episodes=2)
    assert [e.seed for e in run.episodes] == [0, 1] and all(e.ended for e in run.episodes)
    checker.check_fork_by_snapshot(run)
    run.close()
    run = checker.CheckRun.start(_spec(NoStateKeyEnv), num_episodes=1)
    checker.check_reset_returns(run)  # the info is a dict: this rule holds
    with pytest.raises(CheckFailed, match="no 'state_key'"):
        checker.check_state_key(run)
    run.close()


def test_guard_order_errors_still_raise_for_made_envs() -> None:
    env = agentgym.make(_spec(WalkEnv))
    with pytest.raises(ResetNeeded):
        env.step("left")


REGISTERED = [spec.id for spec in agentgym.list_envs() if not spec.id.startswith("test/")]
GYMNASIUM_DIR = Path(gymnasium.__file__).resolve().parent


#: Envs that cannot be made without arguments: what the checks make them with.
REQUIRED_ARGS: dict[str, dict[str, object]] = {
    "harness-v0": {"harness": "agentgym.harness.examples:tool_agent", "tasks": arithmetic_tasks(4)},
    "mcp-v0": {"tasks": [{"prompt": "What is 2.5 + 4?", "answer": 6.5}]},  # + the server: _required_args
}


def _required_args(env_id: str, request: pytest.FixtureRequest) -> dict[str, object]:
    """``REQUIRED_ARGS`` of an env, with a real server where it needs one (mcp-v0: conftest's MCP server)."""
    args = dict(REQUIRED_ARGS.get(env_id, {}))
    if env_id == "mcp-v0":
        args["server_url"] = request.getfixturevalue("mcp_facts_url")
    return args


@pytest.mark.parametrize("env_id", REGISTERED)
def test_check_env_over_every_registered_env(env_id: str, request: pytest.FixtureRequest) -> None:
    if env_id in REQUIRED_ARGS:
        args = _required_args(env_id, request)
        agentgym.check_env(lambda: agentgym.make(env_id, **args))
    else:
        agentgym.check_env(env_id)


def _gymnasium_warnings(env: gymnasium.Env) -> list[str]:
    """Run Gymnasium's own checker; return the warnings it (not the env's libraries) raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gymnasium_check_env(env)
    return [str(w.message) for w in caught if Path(w.filename).resolve().is_relative_to(GYMNASIUM_DIR)]


#: Kwargs that spare Gymnasium's checker from generating games: its unseeded resets draw from the
#: whole pool of 100 TextWorld games, each new one several seconds to build; with a pool of three it
#: plays the games check_env above already built. The env's code is the same at any pool size.
SMALL_POOLS = {"textworld-v0": {"num_games": 3}}


@pytest.mark.parametrize("env_id", REGISTERED)
def test_gymnasium_check_env_over_every_registered_env(env_id: str, request: pytest.FixtureRequest) -> None:
    spec = agentgym.spec(env_id)
    extra = {**SMALL_POOLS.get(env_id, {}), **_required_args(env_id, request)}
    env = agentgym.make(dataclasses.replace(spec, kwargs={**spec.kwargs, **extra}))
    try:
        # Gymnasium checks the unwrapped env (it warns about anything else) and builds fresh
        # guarded ones through env.spec.make() for its render and close checks.
        assert _gymnasium_warnings(env.unwrapped) == []
    finally:
        env.close()


def test_gymnasium_check_env_passes_through_the_guard() -> None:
    env = agentgym.make("maze-v0")
    remaining = _gymnasium_warnings(env)
    assert len(remaining) == 1 and "different from the unwrapped version" in remaining[0]


def test_gymnasium_check_env_catches_what_it_should() -> None:
    class OldSpaceEcho(EchoEnv):
        observation_space = gymnasium.spaces.Text(1_000_000, min_length=0)

    class NoFpsEcho(EchoEnv):
        metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"]}

    with pytest.raises(AssertionError, match="not within the observation space"):
        gymnasium_check_env(OldSpaceEcho())  # "Say something." has a space and a dot
    no_fps = agentgym.make(agentgym.EnvSpec("test/no-fps-v0", NoFpsEcho)).unwrapped
    assert any("render fps" in w for w in _gymnasium_warnings(no_fps))
