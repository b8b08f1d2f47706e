"""check_env must pass honest envs and catch each way an env can break the contract."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

import agentgym
from agentgym.core import Env
from agentgym.errors import EnvContractError
from agentgym.examples import EchoEnv


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


def _spec(cls: type[Env], max_turns: int | None = 8) -> str:
    env_id = f"test/{cls.__name__.lower()}-v0"
    agentgym.register(env_id, cls, max_turns=max_turns, override=True)
    return env_id


def test_honest_envs_pass() -> None:
    agentgym.check_env(_spec(WalkEnv))
    agentgym.check_env(lambda: EchoEnv())
    agentgym.check_env(agentgym.make(_spec(WalkEnv)))


@pytest.mark.parametrize(
    "cls, rule",
    [
        (NoisyEnv, "determinism"),
        (NoStateKeyEnv, "state_key"),
        (NonJsonInfoEnv, "JSON-safe info"),
        (BadToolsEnv, "tools"),
        (RaisesOnGarbageEnv, "raised"),
        (BrokenSnapshotEnv, "fork"),
        (BadAdmissibleEnv, "admissible_actions"),
    ],
)
def test_each_broken_rule_is_caught(cls: type[Env], rule: str) -> None:
    with pytest.raises(EnvContractError, match=rule):
        agentgym.check_env(_spec(cls))


def test_episode_that_never_ends_without_budget_is_caught() -> None:
    with pytest.raises(EnvContractError, match="episode end"):
        agentgym.check_env(_spec(NeverEndsEnv, max_turns=None), max_steps=20)


@pytest.mark.parametrize("env_id", [spec.id for spec in agentgym.list_envs() if not spec.id.startswith("test/")])
def test_check_env_over_every_registered_env(env_id: str) -> None:
    agentgym.check_env(env_id)
