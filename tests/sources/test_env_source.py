"""``EnvSource``: in-process envs, sessions on an env service and a fleet over services from the same
fields; its action format read from the spec or the service; task splits, task routes and a judge wrapping
its envs; and the settings it refuses, in one line."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from scripted_judge import ScriptedJudgeServer

import agentgym
import agentgym.envs  # noqa: F401  (registers the built-in envs)
from agentgym.core import HELD_OUT_SEED_START
from agentgym.errors import ConfigError
from agentgym.http.client import RemoteEnv
from agentgym.http.fleet import EnvFleet
from agentgym.sources.env_source import JUDGE_FIELDS, EnvSource
from agentgym.sources.task_split import RoutedTaskEnv, TaskRoute, TaskSplitEnv


@pytest.fixture
def scripted() -> Iterator[ScriptedJudgeServer]:
    server = ScriptedJudgeServer()
    yield server
    server.live.stop()


def _expert_returns(env: agentgym.Env, seed: int) -> tuple[str, float]:
    observation, info = env.reset(seed=seed)
    total = 0.0
    while (action := env.expert_action()) is not None:
        observation, reward, terminated, truncated, info = env.step(action)
        total += reward
        if terminated or truncated:
            break
    return info["state_key"], total


def test_in_process_and_service_envs_of_one_source_play_alike(live_server) -> None:
    server = live_server(["maze-v0"])
    local = EnvSource("maze-v0", {"size": 3}, max_turns=12)
    remote = dataclasses.replace(local, urls=(server.url,))
    assert local.pool() is not None and not isinstance(local.pool(), EnvFleet)
    local_env, remote_env = local.factory()(), remote.factory()()
    try:
        assert isinstance(remote_env, RemoteEnv) and not isinstance(local_env, RemoteEnv)
        for seed in (0, 5):
            assert _expert_returns(local_env, seed) == _expert_returns(remote_env, seed)
    finally:
        local_env.close()
        remote_env.close()
    fleet = remote.pool()
    try:
        assert isinstance(fleet, EnvFleet)
    finally:
        fleet.close()
    wanted = getattr(agentgym.spec("maze-v0"), "action_format", None) or "plain"
    assert local.action_format() == remote.action_format() == wanted


def test_splits_and_routes_wrap_each_env() -> None:
    split_env = EnvSource("maze-v0", {"size": 2}, split="test").factory()()
    routes = (TaskRoute(0, None), TaskRoute(100, "test"))
    routed_env = EnvSource("maze-v0", {"size": 2}, routes=routes).factory()()
    try:
        assert isinstance(split_env, TaskSplitEnv) and isinstance(routed_env, RoutedTaskEnv)
        # Seed 103 is task 3 of the test split on the routed env, as seed 3 is on the split env.
        assert routed_env.reset(seed=103)[1]["task_id"] == split_env.reset(seed=3)[1]["task_id"]
        plain = agentgym.make("maze-v0", size=2)
        assert routed_env.reset(seed=3)[1]["task_id"] == plain.reset(seed=3)[1]["task_id"]
        plain.close()
    finally:
        split_env.close()
        routed_env.close()


def test_bad_sources_are_one_line_errors() -> None:
    with pytest.raises(ConfigError, match="give a task split or task routes, not both"):
        EnvSource("maze-v0", split="test", routes=(TaskRoute(0, "test"),))
    with pytest.raises(ConfigError, match="a task split is a non-empty name"):
        EnvSource("maze-v0", split="")
    with pytest.raises(ValueError, match="runs in-process; it has no service"):
        EnvSource("maze-v0").client()


def test_judge_fields_are_judge_configs_and_env_source_wraps_its_envs(scripted: ScriptedJudgeServer) -> None:
    from agentgym.judge import JudgeSettings as JudgeConfig

    assert JUDGE_FIELDS == tuple(f.name for f in dataclasses.fields(JudgeConfig))
    source = EnvSource("maze-v0", {"size": 2}, split="test",
                       judge={"base_url": scripted.url, "model": "j", "rubric": "want=1", "mode": "add"})
    env = source.factory()()
    _, info = env.reset(seed=4)
    assert info["task_ref"] == {"split": "test", "index": 4} and info["task_id"].endswith(
        str(HELD_OUT_SEED_START + 4))
    rewards = []
    while (action := env.expert_action()) is not None:
        _, reward, terminated, _, info = env.step(action)
        rewards.append(reward)
        if terminated:
            break
    assert rewards[-1] == 2.0 and info["judge"]["score"] == 1.0  # "add": the env's 1 plus the judge's 1
    env.close()
    with pytest.raises(ConfigError, match="cannot be combined with backend: ray"):
        EnvSource("maze-v0", split="test", backend="ray").pool()
    with pytest.raises(ConfigError, match="judge mode must be 'replace' or 'add'"):
        EnvSource("maze-v0", judge={"base_url": scripted.url, "model": "j", "rubric": "r", "mode": "sum"})
