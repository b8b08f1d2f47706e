"""EpisodeGuard: order enforcement, turn budget, crash reporting, seeds and fork."""

from __future__ import annotations

from typing import Any

import pytest

import agentgym
from agentgym.core import Env
from agentgym.errors import ConfigError, EnvContractError, EnvCrashed, EpisodeFinished, ResetNeeded
from agentgym.guard import EpisodeGuard


class CounterEnv(Env):
    """Counts up/down from a seed-chosen start; random noise in the observation tests RNG forks."""

    def __init__(self) -> None:
        self.value = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.value = int(self.np_random.integers(0, 100))
        return f"value {self.value}", {"state_key": str(self.value)}

    def step(self, action: str):
        if action == "boom":
            raise RuntimeError("kaboom")
        if action == "badinfo":
            return "x", 0.0, False, False, {"no_state_key": 1}
        if action == "badreward":
            return "x", float("nan"), False, False, {"state_key": "x"}
        self.value += {"up": 1, "down": -1}.get(action, 0)
        noise = int(self.np_random.integers(0, 1000))
        return (f"value {self.value} noise {noise}", 0.0, self.value == 200, False,
                {"state_key": str(self.value)})


@pytest.fixture()
def counter() -> EpisodeGuard:
    agentgym.register("test/counter-v0", CounterEnv, max_turns=5, override=True)
    return agentgym.make("test/counter-v0")


def test_step_before_reset_and_after_end(counter: EpisodeGuard) -> None:
    with pytest.raises(ResetNeeded):
        counter.step("up")
    counter.reset(seed=1)
    for _ in range(4):
        assert counter.step("up")[3] is False
    assert counter.step("up")[3] is True  # fifth turn hits the budget
    with pytest.raises(EpisodeFinished, match="after 5 turns"):
        counter.step("up")
    counter.reset(seed=1)
    assert counter.turn == 0


def test_env_exception_becomes_env_crashed(counter: EpisodeGuard) -> None:
    counter.reset(seed=0)
    with pytest.raises(EnvCrashed, match="RuntimeError: kaboom") as info:
        counter.step("boom")
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(EpisodeFinished):
        counter.step("up")
    counter.reset(seed=0)  # a new episode works
    counter.step("up")


@pytest.mark.parametrize("action, message", [("badinfo", "state_key"), ("badreward", "finite")])
def test_malformed_returns_break_the_contract(counter: EpisodeGuard, action: str, message: str) -> None:
    counter.reset(seed=0)
    with pytest.raises(EnvContractError, match=message):
        counter.step(action)


def test_non_string_action_and_bad_seed(counter: EpisodeGuard) -> None:
    counter.reset(seed=0)
    with pytest.raises(EnvContractError, match="action must be a str"):
        counter.step(3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="seed"):
        counter.reset(seed=-1)
    with pytest.raises(ConfigError, match="options"):
        counter.reset(options=[1])  # type: ignore[arg-type]


def test_seedless_resets_are_replayable_and_reproducible(counter: EpisodeGuard) -> None:
    other = agentgym.make("test/counter-v0")
    counter.reset(seed=7)
    other.reset(seed=7)
    seeds_a = [counter.reset()[0] and counter.episode_seed for _ in range(3)]
    seeds_b = [other.reset()[0] and other.episode_seed for _ in range(3)]
    assert seeds_a == seeds_b and len(set(seeds_a)) == 3
    obs, _ = counter.reset()
    assert other.reset(seed=counter.episode_seed)[0] == obs


@pytest.mark.parametrize("mode", ["auto", "replay"])
def test_fork_continues_identically_and_independently(counter: EpisodeGuard, mode: str) -> None:
    counter.reset(seed=3)
    counter.step("up")
    counter.step("down")
    child = counter.fork(mode)  # type: ignore[arg-type]
    assert child.turn == 2 and child.actions == ("up", "down")
    assert child.step("up") == counter.step("up")  # same RNG continuation (noise) and state
    child.step("up")
    child.step("up")  # child is now further; parent unaffected
    assert counter.turn == 3 and child.turn == 5 and child.episode_over and not counter.episode_over


def test_fork_errors(counter: EpisodeGuard) -> None:
    with pytest.raises(ResetNeeded):
        counter.fork()
    counter.reset(seed=0)
    with pytest.raises(ConfigError, match="no snapshot"):
        counter.fork("snapshot")
    with pytest.raises(ConfigError, match="fork mode"):
        counter.fork("teleport")  # type: ignore[arg-type]
    bare = EpisodeGuard(CounterEnv())
    bare.reset(seed=0)
    with pytest.raises(EnvContractError, match="agentgym.make"):
        bare.fork()


def test_snapshot_restore_roundtrip_via_replay_record(counter: EpisodeGuard) -> None:
    counter.reset(seed=5)
    counter.step("up")
    blob = counter.snapshot()
    expected = counter.step("down")
    other = agentgym.make("test/counter-v0")
    other.restore(blob)
    assert other.turn == 1 and other.step("down") == expected


def test_close_is_idempotent_and_final(counter: EpisodeGuard) -> None:
    counter.close()
    counter.close()
    with pytest.raises(EnvContractError, match="closed"):
        counter.reset(seed=0)


class FlakyExpertEnv(CounterEnv):
    has_expert = True

    def expert_action(self) -> str | None:
        raise KeyError("no plan")


def test_expert_crash_is_reported_without_ending_the_episode() -> None:
    agentgym.register("test/flaky-expert-v0", FlakyExpertEnv, max_turns=5, override=True)
    env = agentgym.make("test/flaky-expert-v0")
    env.reset(seed=0)
    with pytest.raises(EnvCrashed, match="unaffected"):
        env.expert_action()
    assert env.step("up")[0].startswith("value")  # the episode goes on
