"""``textworld-v0``: the contract, the game cache, state keys, invalid commands, the expert, HTTP.

Every game is generated once per test session into a temporary cache (pools of 2 games per
challenge, small settings), so the module runs in about a minute on 2 cores.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import agentgym
from agentgym.checker import check_env
from agentgym.envs.registration import register_textworld_envs
from agentgym.envs.textworld import games as tw
from agentgym.errors import ConfigError

pytestmark = pytest.mark.timeout(300)

ENV_ID = "textworld-v0"
#: Small settings per challenge: quick to generate and solved in a handful of commands.
SMALL: dict[str, dict[str, Any]] = {
    "tw-simple": {},
    "tw-coin_collector": {"level": 2},
    "tw-treasure_hunter": {"level": 2},
    "tw-cooking": {"recipe": 1, "take": 1, "go": 1, "cook": False, "cut": True, "open": True},
}


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    register_textworld_envs()
    return tmp_path_factory.mktemp("textworld-cache")


def make(cache_dir: Path, challenge: str, **kwargs: Any) -> agentgym.EpisodeGuard:
    kwargs.setdefault("num_games", 2)
    return agentgym.make(ENV_ID, challenge=challenge, settings=SMALL[challenge],
                         game_cache_dir=str(cache_dir), **kwargs)


def play_expert(env: agentgym.EpisodeGuard, seed: int, prefix: tuple[str, ...] = ()) -> dict[str, Any]:
    _, info = env.reset(seed=seed)
    for action in prefix:
        *_, info = env.step(action)
    total = 0.0
    while not env.episode_over:
        action = env.expert_action()
        assert action is not None and action in info["admissible_actions"], (action, info)
        _, reward, _, _, info = env.step(action)
        total += reward
    info["return"] = total
    return info


@pytest.mark.parametrize("challenge", sorted(SMALL))
def test_check_env(cache_dir: Path, challenge: str) -> None:
    check_env(lambda: make(cache_dir, challenge), num_episodes=2)


@pytest.mark.parametrize("challenge", sorted(SMALL))
def test_expert_wins_from_start_and_after_a_deviation(cache_dir: Path, challenge: str) -> None:
    env = make(cache_dir, challenge)
    for seed in (0, 1):
        info = play_expert(env, seed)
        assert info["success"] and info["score"] == info["max_score"] == info["return"], info
        # Deviate first (a non-expert admissible command), then let the expert recover.
        _, first = env.reset(seed=seed)
        detour = next(a for a in first["admissible_actions"] if a != env.expert_action() and "eat" not in a)
        assert play_expert(env, seed, (detour, "look"))["success"]
    env.close()


def test_second_make_reuses_the_cached_game(cache_dir: Path, tmp_path: Path) -> None:
    env = agentgym.make(ENV_ID, challenge="tw-treasure_hunter", settings={"level": 1}, num_games=1,
                        game_cache_dir=str(tmp_path))
    before = tw.generation_count
    obs, info = env.reset(seed=0)
    assert tw.generation_count == before + 1
    (entry,) = (tmp_path / "tw-treasure_hunter").iterdir()
    mtimes = {p.name: p.stat().st_mtime_ns for p in entry.iterdir()}
    assert sorted(mtimes) == ["game.json", "game.z8", "meta.json"]
    env.close()

    again = agentgym.make(ENV_ID, challenge="tw-treasure_hunter", settings={"level": 1}, num_games=1,
                          game_cache_dir=str(tmp_path))
    assert again.reset(seed=5) == (obs, info)  # pool of one game: every seed plays it
    assert tw.generation_count == before + 1
    assert {p.name: p.stat().st_mtime_ns for p in entry.iterdir()} == mtimes
    assert not [p for p in entry.parent.iterdir() if p.name.startswith(".tmp")]

    # A corrupt entry (truncated story file) is detected by its checksum and regenerated.
    (entry / "game.z8").write_bytes(b"garbage")
    third = agentgym.make(ENV_ID, challenge="tw-treasure_hunter", settings={"level": 1}, num_games=1,
                          game_cache_dir=str(tmp_path))
    assert third.reset(seed=0) == (obs, info)
    assert tw.generation_count == before + 2
    (entry / "meta.json").write_text("{not json", encoding="utf-8")
    assert third.reset(seed=0) == (obs, info)
    assert tw.generation_count == before + 3
    again.close()
    third.close()


def test_cache_dir_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AGENTGYM_CACHE", str(tmp_path))
    assert tw.default_cache_dir() == tmp_path / "textworld"
    assert tw.TextWorldEnv("tw-simple").cache_dir == tmp_path / "textworld"
    monkeypatch.delenv("AGENTGYM_CACHE")
    assert tw.default_cache_dir() == Path.home() / ".cache" / "agentgym" / "textworld"


def test_state_key_names_the_state_not_the_path(cache_dir: Path) -> None:
    env = make(cache_dir, "tw-simple")
    _, start = env.reset(seed=0)
    openable = sorted(a for a in start["admissible_actions"] if a.startswith("open "))
    assert len(openable) >= 2, start["admissible_actions"]
    first, second = openable[:2]
    keys = []
    for order in ((first, second), (second, first), ("look", second, "inventory", first)):
        env.reset(seed=0)
        for action in order:
            *_, info = env.step(action)
            assert not info["invalid_action"]
        keys.append(info["state_key"])
    assert keys[0] == keys[1] == keys[2]
    assert keys[0] != start["state_key"]
    # Looking changes the text, not the state.
    env.reset(seed=0)
    looked = env.step("look")
    assert looked[4]["state_key"] == start["state_key"]
    # The same state in another game has another key.
    _, other = env.reset(seed=1)
    assert other["state_key"] != start["state_key"]
    env.close()


def test_invalid_commands_change_nothing(cache_dir: Path) -> None:
    env = make(cache_dir, "tw-simple")
    obs0, info0 = env.reset(seed=0)
    assert "$$" not in obs0 and "-= " in obs0  # the banner is gone, the room is there
    assert not obs0.endswith(("0/1", ">")) and "\n\n\n" not in obs0  # no prompt, status line, blank runs
    assert info0["admissible_actions"] == sorted(info0["admissible_actions"])
    assert "admissible" in info0["instructions"]
    for bad in ("", "dance wildly", "go west " * 50, "north", "examine me"):
        obs, reward, terminated, truncated, info = env.step(bad)
        assert info["invalid_action"] and reward == 0.0 and not (terminated or truncated), bad
        assert "Invalid action" in obs and info["state_key"] == info0["state_key"]
        assert info["admissible_actions"] == info0["admissible_actions"]
    # Spelling variants of an admissible command are accepted.
    action = next(a for a in info0["admissible_actions"] if a.startswith("open "))
    _, _, _, _, info = env.step(f"  {action.upper()}. ")
    assert not info["invalid_action"] and info["state_key"] != info0["state_key"]
    # The invalid steps did not reach the game: the trajectory equals the one without them.
    fresh = make(cache_dir, "tw-simple")
    fresh.reset(seed=0)
    assert fresh.step(action)[4] == info
    json.dumps(info)
    env.close()
    fresh.close()


def test_task_id_round_trip(cache_dir: Path) -> None:
    env = make(cache_dir, "tw-coin_collector")
    obs, info = env.reset(seed=1)
    assert info["task_id"] == "tw-coin_collector/level=2/seed1"
    assert env.reset(seed=123, options={"task_id": info["task_id"]}) == (obs, info)
    offset = make(cache_dir, "tw-coin_collector", game_seed_offset=1)
    assert offset.reset(seed=0) == (obs, info)  # the pool starts at game seed 1
    with pytest.raises(ConfigError, match="level=3"):
        agentgym.make(ENV_ID, challenge="tw-coin_collector", settings={"level": 3},
                      game_cache_dir=str(cache_dir)).reset(options={"task_id": info["task_id"]})
    for bad in ("tw-coin_collector/level=2/seedX", "maze/idx1", 7):
        with pytest.raises(ConfigError, match="task_id"):
            env.reset(options={"task_id": bad})
    env.close()
    offset.close()


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"challenge": "tw-zork"}, "tw-cooking"),
        ({"challenge": "tw-simple", "settings": {"reward": "dense"}}, "rewards"),
        ({"challenge": "tw-simple", "settings": {"rewards": "lots"}}, "'dense'"),
        ({"challenge": "tw-coin_collector", "settings": {"level": 0}}, "[1, 300]"),
        ({"challenge": "tw-coin_collector", "settings": {"level": True}}, "level"),
        ({"challenge": "tw-coin_collector", "settings": {"level": 250}}, "100"),
        ({"challenge": "tw-cooking", "settings": {"recipe": 1, "take": 2}}, "take"),
        ({"challenge": "tw-cooking", "settings": {"go": 4}}, "go"),
        ({"challenge": "tw-simple", "settings": ["dense"]}, "dict"),
        ({"challenge": "tw-simple", "num_games": 0}, "num_games"),
        ({"challenge": "tw-simple", "game_seed_offset": -1}, "game_seed_offset"),
    ],
)
def test_bad_arguments_raise_config_errors(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as caught:
        agentgym.make(ENV_ID, **kwargs)
    assert needle in str(caught.value)


def test_a_failed_generation_names_the_parameters(tmp_path: Path) -> None:
    # Settings that pass no validation of ours: TextWorld's cooking generator refuses to shuffle
    # the recipe (recipe_seed > 0) without the 'take' skill.
    settings = dict(tw.validate_settings("tw-cooking", {"take": 0}), recipe_seed=3)
    with pytest.raises(ConfigError,
                       match=r"could not generate tw-cooking with settings .*'recipe_seed': 3.* seed 4"):
        tw.ensure_game("tw-cooking", settings, 4, tmp_path)
    assert not list((tmp_path / "tw-cooking").iterdir())  # no half-written entry is left behind


def test_served_over_http_like_a_local_env(cache_dir: Path) -> None:
    from fastapi.testclient import TestClient

    from agentgym.http.client import EnvClient, RemoteEnv
    from agentgym.http.server import create_app

    kwargs = {"challenge": "tw-cooking", "settings": SMALL["tw-cooking"], "num_games": 2,
              "game_cache_dir": str(cache_dir)}
    with TestClient(create_app([ENV_ID], num_workers=2)) as service:
        client = EnvClient(client=service)
        remote = RemoteEnv(ENV_ID, client=client, **kwargs)
        local = agentgym.make(ENV_ID, **kwargs)
        assert remote.reset(seed=1) == local.reset(seed=1)
        for action in ("not a command", "look"):
            assert remote.step(action) == local.step(action)
        while not local.episode_over:
            action = local.expert_action()
            assert remote.expert_action() == action
            assert remote.step(action) == local.step(action)
        remote.close()
        local.close()
