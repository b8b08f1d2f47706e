"""``env.backend: ray``: envs in Ray actors on a local Ray instance collect what local envs collect."""

from __future__ import annotations

import pytest
from test_fleet import MAX_TURNS, MAZE, ForkAndTopUp, collect

import agentgym
from agentgym.errors import ConfigError, EpisodeFinished
from agentgym.rollout.pool import PoolEnv
from agentgym.rollout.ray_pool import RayEnvPool

pytestmark = pytest.mark.timeout(240)


def test_ray_actors_collect_what_local_envs_collect() -> None:
    expected = collect(lambda: agentgym.make("maze-v0", max_turns=MAX_TURNS, **MAZE), ForkAndTopUp())
    pool = RayEnvPool("maze-v0", kwargs=MAZE, max_turns=MAX_TURNS, num_workers=2)
    try:
        env = pool()  # a stand-alone env in an actor
        assert isinstance(env, PoolEnv)
        obs, _ = env.reset(seed=4)
        assert obs == agentgym.make("maze-v0", max_turns=MAX_TURNS, **MAZE).reset(seed=4)[0]
        [slot] = pool.open(1)
        pool.reset([slot], [0])
        for _ in range(MAX_TURNS):
            pool.step([slot], ["up"])
        with pytest.raises(EpisodeFinished):  # the env's own error, raised here
            pool.step([slot], ["up"])
        env.close()
        pool.release([slot])
        assert sorted(pool._load) == [0, 0]
        got = collect(pool, ForkAndTopUp())  # the collector closes the pool, and with it Ray
    finally:
        pool.close()
    assert got == expected
    assert not pool._ray.is_initialized()


def test_an_unknown_env_fails_before_ray_starts() -> None:
    with pytest.raises(agentgym.errors.UnknownEnv):
        RayEnvPool("no-such-env-v0")
    with pytest.raises(ConfigError, match="num_workers"):
        RayEnvPool("maze-v0", num_workers=0)
