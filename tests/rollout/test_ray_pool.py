"""``env.backend: ray``: envs in Ray actors on a local Ray instance collect what local envs collect."""

from __future__ import annotations

import pytest
from maze_collection import MAX_TURNS, MAZE, ForkAndTopUp, collect

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


def test_a_run_on_ray_actors_takes_its_sft_start_from_the_expert(tmp_path) -> None:
    # Envs in Ray actors answer resets and steps, not expert calls: the run's check and demonstrations play
    # in-process envs of the same id and settings, so the quickstart's SFT start works with backend: ray.
    from learning import small

    from agentgym.training.config.loading import load_config
    from agentgym.training.run.loop import train

    local = train(load_config(None, small("iterations=1")), tmp_path / "local")["sft"]
    on_ray = train(load_config(None, small("iterations=1", "env.backend=ray", "env.ray_workers=1")),
                   tmp_path / "ray")["sft"]
    assert on_ray["demo_turns"] > 0
    assert (on_ray["expert_success_rate"], on_ray["demo_turns"]) == (local["expert_success_rate"],
                                                                     local["demo_turns"])
    import ray

    assert not ray.is_initialized()  # the run's pool shut down the instance it started
