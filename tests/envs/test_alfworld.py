"""``alfworld-v0``: generated ALFWorld games, the official-data path, the expert, errors, HTTP.

Real ``alfworld``/``textworld``, no mocks. Twelve small games (two per task type) are generated
once into a per-module cache and shared; the official-data path is exercised by exporting them as
an ``$ALFWORLD_DATA`` folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import agentgym
from agentgym.checker import check_env
from agentgym.envs.alfworld import generation as gen
from agentgym.envs.alfworld.engine import AlfredEngine, require_alfworld
from agentgym.envs.alfworld.env import AlfWorldEnv
from agentgym.envs.registration import register_alfworld_envs
from agentgym.errors import ConfigError

pytestmark = pytest.mark.timeout(300)

ENV_ID = "alfworld-v0"
SMALL: dict[str, Any] = {"num_receptacles": 6, "num_distractors": 3}
POOL = 12  # pool indices 0-11: two games of each task type (task types take turns)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    register_alfworld_envs()
    path = tmp_path_factory.mktemp("alfworld-cache")
    env = make(path)
    for seed in range(POOL):  # generate every game of the pool once, for all tests
        env.reset(seed=seed)
    env.close()
    return path


@pytest.fixture(autouse=True)
def _no_official_data(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)


def make(cache: Path, **kwargs: Any) -> agentgym.EpisodeGuard:
    kwargs = {"num_games": POOL, "game_cache_dir": str(cache), **SMALL, **kwargs}
    return agentgym.make(ENV_ID, **kwargs)


def play_expert(env: agentgym.EpisodeGuard, **reset: Any) -> tuple[list[str], dict[str, Any]]:
    _, info = env.reset(**reset)
    actions: list[str] = []
    while not env.episode_over:
        action = env.expert_action()
        assert action is not None and action in info["admissible_actions"], (action, info)
        actions.append(action)
        *_, info = env.step(action)
    return actions, info


def game_file(cache: Path, task_type: str, game_seed: int) -> Path:
    return gen.ensure_game(task_type, game_seed, cache_dir=cache, **SMALL)


def test_check_env(cache_dir: Path) -> None:
    check_env(lambda: make(cache_dir))


@pytest.mark.parametrize("task_type", gen.TASK_TYPES)
def test_each_task_type_is_generated_and_solved_by_both_experts(cache_dir: Path, task_type: str) -> None:
    env = make(cache_dir)
    planner = make(cache_dir, expert_type="planner")
    seeds = [i for i in range(POOL) if gen.TASK_TYPES[i % 6] == task_type]
    for seed in seeds:
        actions, info = play_expert(env, seed=seed)
        assert info["success"] and info["task_type"] == task_type, info
        assert 1 < len(actions) <= gen.EXPERT_STEP_LIMIT and actions[0] == "look"  # AlfredExpert's first plan
        # The env's expert replays the walkthrough the generator recorded (same loading path).
        recorded = json.loads(game_file(cache_dir, task_type, seed).read_text())
        assert recorded["solvable"] is True and recorded["walkthrough"] == actions
        planned, planned_info = play_expert(planner, seed=seed)
        assert planned_info["success"] and len(planned) <= gen.EXPERT_STEP_LIMIT
    obs, info = env.reset(seed=seeds[0])
    assert obs.startswith("-= Welcome to TextWorld, ALFRED! =-") and "Your task is to: " in obs
    assert obs.rstrip().endswith(info["task"]) and "help" not in info["admissible_actions"]
    assert {"look", "inventory"} <= set(info["admissible_actions"])  # kept, as verl-agent keeps them
    env.close()
    planner.close()


def test_move_aware_expert_fixes_alfworld_two_object_bookkeeping(cache_dir: Path) -> None:
    # alfworld 0.4.2's own expert (track_moves=False) misses its drops ("move", not "put") and
    # wanders on two-object tasks; the engine's default tells it the move as a put.
    steps = {}
    for track in (True, False):
        engine = AlfredEngine.acquire("handcoded", track_moves=track)
        total = 0
        for seed in (5, 11):
            engine.load(game_file(cache_dir, "pick_two_obj_and_place", seed))
            state = engine.reset()
            while not state["won"] and engine.moves < 50:
                state = engine.step(state["extra.expert_plan"][0])
            total += engine.moves
        steps[track] = total
        engine.release()
    assert steps[True] < steps[False], steps


def test_generated_files_are_alfworld_format_and_load_through_alfworld(cache_dir: Path,
                                                                        tmp_path: Path) -> None:
    import textworld
    import textworld.gym
    from alfworld.agents.environment.alfred_tw_env import (
        AlfredDemangler,
        AlfredExpert,
        AlfredInfos,
        AlfredTWEnv,
    )

    root = tmp_path / "data"
    files = gen.write_dataset(root, {"train": 6}, cache_dir=cache_dir, **SMALL)
    assert (root / "logic" / "alfred.pddl").is_file() and (root / "logic" / "alfred.twl2").is_file()
    for path in files:
        game = json.loads(path.read_text())
        assert set(game) == {"pddl_domain", "grammar", "pddl_problem", "solvable", "walkthrough"}
        assert "UNKNOWN GOAL" not in game["grammar"] and "(:domain alfred)" in game["pddl_problem"]
        traj = json.loads((path.parent / "traj_data.json").read_text())
        assert traj["task_type"] in gen.TASK_TYPES and path.parent.parent.name.startswith(traj["task_type"])
        assert set(traj["pddl_params"]) >= {"object_target", "parent_target", "toggle_target",
                                            "mrecep_target", "object_sliced"}
    # ALFWorld's own collector accepts the folder (movable/Sliced/solvable/task-type filters) ...
    config = {"env": {"goal_desc_human_anns_prob": 0, "task_types": [1, 2, 3, 4, 5, 6]},
              "dataset": {"data_path": str(root / "json_2.1.1" / "train"), "num_train_games": -1}}
    assert sorted(AlfredTWEnv(config, train_eval="train").game_files) == sorted(map(str, files))
    # ... and its gym path (textworld.gym + the three wrappers, alfworld's expert unpatched) plays the
    # games to a win with the expert plan it computes: all of them with the planner; all but the
    # two-object one with the handcoded expert, whose bookkeeping misses "move" (see
    # alfworld_engine._move_aware_expert_class).
    infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile", "expert_plan"])
    for expert_type in ("planner", "handcoded"):
        env_id = textworld.gym.register_games(
            [str(f) for f in files], infos, batch_size=1, asynchronous=False, max_episode_steps=50,
            wrappers=[AlfredDemangler(shuffle=False), AlfredInfos, AlfredExpert(expert_type=expert_type)])
        env = textworld.gym.make(env_id)
        won = {}
        for _ in files:
            _, state = env.reset()
            gamefile, done = state["extra.gamefile"][0], [False]
            while not done[0]:
                _, _, done, state = env.step([state["extra.expert_plan"][0][0]])
            won[Path(gamefile).parent.parent.name.split("-")[0]] = state["won"][0]
        env.close()
        assert sorted(won) == sorted(gen.TASK_TYPES)
        assert all(won.values()) or (expert_type == "handcoded" and [t for t, w in won.items() if not w]
                                     == ["pick_two_obj_and_place"]), (expert_type, won)


def test_official_data_path_serves_an_exported_tree(cache_dir: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "data"
    gen.write_dataset(root, {"train": 6}, cache_dir=cache_dir, **SMALL)
    # A trial ALFWorld would skip (not solvable) and a "movable" one (unsupported) are skipped here too.
    for name, patch in (("pick_two_obj_and_place-Mug-None-Shelf-1/trial_Gunsolvable", {"solvable": False}),
                        ("pick_and_place_with_movable_recep-Mug-Cup-Shelf-1/trial_Gmovable", {})):
        folder = root / "json_2.1.1" / "train" / name
        folder.mkdir(parents=True)
        first = next((root / "json_2.1.1" / "train").glob("pick_and_place_simple-*/trial_G*"))
        (folder / "game.tw-pddl").write_text(json.dumps({**json.loads((first / "game.tw-pddl").read_text()),
                                                         **patch}))
        (folder / "traj_data.json").write_text((first / "traj_data.json").read_text())

    real = agentgym.make(ENV_ID, data_dir=str(root))
    generated = make(cache_dir)
    assert real.unwrapped.num_games == 6
    views: dict[str, list[Any]] = {"real": [], "generated": []}
    for seed in range(6):
        obs, info = real.reset(seed=seed)
        assert info["task_id"].startswith(f"train/{info['task_type']}-") and "/trial_G" in info["task_id"]
        assert real.reset(seed=99, options={"task_id": info["task_id"]}) == (obs, info)
        actions, final = play_expert(real, seed=seed)
        assert final["success"]
        views["real"].append((obs, info["task_type"], info["admissible_actions"], actions))
        gen_obs, gen_info = generated.reset(seed=seed)
        views["generated"].append((gen_obs, gen_info["task_type"], gen_info["admissible_actions"],
                                   play_expert(generated, seed=seed)[0]))
    # The same games, played the same way from either folder (the real-data order is by path).
    assert sorted(views["real"]) == sorted(views["generated"])
    check_env(lambda: agentgym.make(ENV_ID, data_dir=str(root)), num_episodes=2)
    # ALFWORLD_DATA selects the same folder; task_types filters it.
    monkeypatch.setenv("ALFWORLD_DATA", str(root))
    heat = agentgym.make(ENV_ID, task_types=["pick_heat_then_place_in_recep"])
    assert heat.unwrapped.data_dir == root and heat.unwrapped.num_games == 1
    assert heat.reset(seed=3)[1]["task_type"] == "pick_heat_then_place_in_recep"
    for env in (real, generated, heat):
        env.close()


@pytest.mark.parametrize(
    ("layout", "needle"),
    [
        ("missing", "is not a folder; expected ALFWorld's data there"),
        ("empty", "has no json_2.1.1/train/*/*/game.tw-pddl; run alfworld-download"),
        ("no_traj", "traj_data.json is missing"),
        ("corrupt_traj", "traj_data.json is corrupt"),
        ("corrupt_game", "game.tw-pddl is corrupt"),
        ("not_a_game", "is not an ALFWorld game file"),
        ("bad_pddl", "is not a valid ALFWorld game file"),
    ],
)
def test_missing_or_corrupt_data_folders_raise_config_errors(cache_dir: Path, tmp_path: Path, layout: str,
                                                             needle: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "data"
    if layout != "missing":
        (root / "json_2.1.1" / "train").mkdir(parents=True)
    if layout not in ("missing", "empty"):
        trial = root / "json_2.1.1" / "train" / "pick_and_place_simple-Apple-None-Fridge-1" / "trial_G1"
        trial.mkdir(parents=True)
        source = game_file(cache_dir, "pick_and_place_simple", 0)
        game, traj = source.read_text(), (source.parent / "traj_data.json").read_text()
        broken = {"corrupt_game": game[: len(game) // 2], "not_a_game": "{}",
                  "bad_pddl": json.dumps({**json.loads(game), "pddl_problem": "(define (problem x"})}
        (trial / "game.tw-pddl").write_text(broken.get(layout, game))
        if layout != "no_traj":
            (trial / "traj_data.json").write_text("{oops" if layout == "corrupt_traj" else traj)
    monkeypatch.setenv("ALFWORLD_DATA", str(root))
    with pytest.raises(ConfigError) as caught:
        agentgym.make(ENV_ID).reset(seed=0)
    assert needle in str(caught.value) and str(root) in str(caught.value), str(caught.value)


def test_alfworld_data_variable_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    message = "ALFWORLD_DATA=/nonexistent/alfworld is not a folder"
    monkeypatch.setenv("ALFWORLD_DATA", "/nonexistent/alfworld")
    with pytest.raises(ConfigError, match=message):
        agentgym.make(ENV_ID)
    # The empty ~/.cache/alfworld that `import alfworld` creates and exports means "not set".
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".cache" / "alfworld").mkdir(parents=True)
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / ".cache" / "alfworld"))
    assert AlfWorldEnv(game_cache_dir=str(tmp_path)).data_dir is None
    # Importing alfworld through agentgym leaves the variable as it was.
    monkeypatch.delenv("ALFWORLD_DATA")
    require_alfworld()
    assert "ALFWORLD_DATA" not in os.environ


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"task_types": ["pick_and_place"]}, "pick_two_obj_and_place"),
        ({"task_types": [7]}, "look_at_obj_in_light"),
        ({"task_types": []}, "empty"),
        ({"task_types": [1, "pick_and_place_simple"]}, "twice"),
        ({"split": "test"}, "valid_unseen"),
        ({"expert_type": "oracle"}, "planner"),
        ({"num_receptacles": 3}, "[5, 20]"),
        ({"num_distractors": -1}, "[0, 30]"),
        ({"num_games": 0}, "num_games"),
    ],
)
def test_bad_arguments_raise_config_errors(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as caught:
        agentgym.make(ENV_ID, **kwargs)
    assert needle in str(caught.value)


def test_task_types_filter_and_numbers(cache_dir: Path) -> None:
    env = make(cache_dir, task_types=[4])  # ALFWorld's number for the heat task
    seen = {env.reset(seed=s)[1]["task_type"] for s in range(3)}
    assert seen == {"pick_heat_then_place_in_recep"}
    env.close()


def test_held_out_splits_are_disjoint() -> None:
    problems: dict[str, set[str]] = {}
    for split in gen.SPLITS:
        seeds = {gen.pool_game(split, i, gen.TASK_TYPES)[1] for i in range(40)}
        assert {gen.split_of_seed(s) for s in seeds} == {split}
        problems[split] = set()
        for i in range(12):
            task_type, seed = gen.pool_game(split, i, gen.TASK_TYPES)
            game = gen.build_game(task_type, seed, **SMALL)
            low, high = gen.SCENES[split]
            assert low <= game.traj_data["scene"]["scene_num"] < high
            problems[split].add(game.game["pddl_problem"])
    assert not problems["train"] & problems["valid_seen"] and not problems["train"] & problems["valid_unseen"]
    assert not problems["valid_seen"] & problems["valid_unseen"]
    assert gen.SCENES["valid_unseen"][0] >= gen.SCENES["train"][1]  # unseen rooms are never trained on
    # The same arguments build the same game.
    assert gen.build_game("pick_cool_then_place_in_recep", 7, **SMALL) == gen.build_game(
        "pick_cool_then_place_in_recep", 7, **SMALL)


def test_second_make_hits_the_cache(tmp_path: Path) -> None:
    kwargs = {"task_types": ["pick_and_place_simple"], "num_games": 1, "game_cache_dir": str(tmp_path),
              **SMALL}
    before = gen.generation_count
    env = agentgym.make(ENV_ID, **kwargs)
    obs, info = env.reset(seed=0)
    assert gen.generation_count == before + 1
    (entry,) = tmp_path.glob("generated-*/json_2.1.1/train/pick_and_place_simple-seed0")
    files = sorted(p for p in entry.rglob("*") if p.is_file())
    assert [p.name for p in files] == ["meta.json", "game.tw-pddl", "traj_data.json"]
    mtimes = {p: p.stat().st_mtime_ns for p in files}
    env.close()

    again = agentgym.make(ENV_ID, **kwargs)
    assert again.reset(seed=5) == (obs, info)  # pool of one game: every seed plays it
    assert gen.generation_count == before + 1
    assert {p: p.stat().st_mtime_ns for p in files} == mtimes
    assert not [p for p in entry.parent.iterdir() if p.name.startswith(".tmp")]
    # A corrupt entry is detected by its checksum and regenerated, identically.
    (entry / "trial_generated" / "game.tw-pddl").write_text("garbage")
    assert again.reset(seed=0) == (obs, info)
    assert gen.generation_count == before + 2
    again.close()


def test_cache_dir_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AGENTGYM_CACHE", str(tmp_path))
    assert gen.default_cache_dir() == tmp_path / "alfworld"
    assert AlfWorldEnv().cache_dir == tmp_path / "alfworld"


def test_invalid_actions_never_reach_the_game(cache_dir: Path) -> None:
    env = make(cache_dir)
    env.reset(seed=3)
    *_, info0 = env.step("look")
    expert0 = env.expert_action()
    assert expert0 != "look"
    for bad in ("", "dance", "help", "go to the moon " * 30, "take apple 9 from countertop 1"):
        obs, reward, terminated, truncated, info = env.step(bad)
        assert info["invalid_action"] and reward == 0.0 and not (terminated or truncated), bad
        assert obs.startswith("Nothing happens.") and "admissible" in obs
        assert info["state_key"] == info0["state_key"]
        assert info["admissible_actions"] == info0["admissible_actions"]
        assert env.expert_action() == expert0  # the expert did not see it either
    target = next(a for a in info0["admissible_actions"] if a.startswith("go to "))
    *_, info = env.step(f"  {target.upper()}. ")
    assert not info["invalid_action"]
    fresh = make(cache_dir)
    fresh.reset(seed=3)
    fresh.step("look")
    assert fresh.step(target)[4] == info  # the invalid steps left no trace
    env.close()
    fresh.close()


def test_state_key_names_the_world_state(cache_dir: Path) -> None:
    env = make(cache_dir)
    _, start = env.reset(seed=4)  # a cooling task: the kitchen has a fridge
    keys = {}
    for name, actions in {
        "look": ["look", "inventory"],
        "fridge": ["go to fridge 1"],
        "via": [next(a for a in start["admissible_actions"] if a.startswith("go to ") and "fridge" not in a),
                "go to fridge 1", "examine fridge 1"],
        "open-close": ["go to fridge 1", "open fridge 1", "close fridge 1"],
        "open": ["go to fridge 1", "open fridge 1"],
    }.items():
        env.reset(seed=4)
        for action in actions:
            *_, info = env.step(action)
            assert not info["invalid_action"], action
        keys[name] = info["state_key"]
    assert keys["look"] == start["state_key"]
    assert keys["fridge"] == keys["via"] == keys["open-close"] != start["state_key"]
    assert keys["open"] != keys["fridge"]
    assert env.reset(seed=10)[1]["state_key"] != start["state_key"]  # another game
    env.close()


def test_task_id_round_trip_and_errors(cache_dir: Path) -> None:
    env = make(cache_dir)
    obs, info = env.reset(seed=7)
    assert info["task_id"] == "gen-r6-d3/train/look_at_obj_in_light/seed7"
    assert env.reset(seed=0, options={"task_id": info["task_id"]}) == (obs, info)
    other = make(cache_dir, split="valid_seen")  # any split's env plays a named game
    assert other.reset(options={"task_id": info["task_id"]}) == (obs, info)
    with pytest.raises(ConfigError, match="num_receptacles=6"):
        agentgym.make(ENV_ID, game_cache_dir=str(cache_dir)).reset(options={"task_id": info["task_id"]})
    for bad in ("gen-r6-d3/train/cook_dinner/seed1", "train/x/y", 7):
        with pytest.raises(ConfigError, match="task_id"):
            env.reset(options={"task_id": bad})
    env.close()
    other.close()


def test_threads_play_like_one_thread(cache_dir: Path) -> None:
    # The engine lock and the per-thread expert generator keep concurrent envs deterministic.
    seeds = [5, 11, 2, 8]
    alone = {seed: play_expert(make(cache_dir), seed=seed) for seed in seeds}
    together: dict[int, Any] = {}

    def run(seed: int) -> None:
        together[seed] = play_expert(make(cache_dir), seed=seed)

    threads = [threading.Thread(target=run, args=(seed,)) for seed in seeds]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert together == alone


def test_registration_does_not_import_alfworld_and_missing_alfworld_is_a_config_error() -> None:
    code = (
        "import sys\n"
        "import agentgym\n"
        "assert 'alfworld-v0' in [spec.id for spec in agentgym.list_envs()]\n"
        "assert 'alfworld' not in sys.modules and 'textworld' not in sys.modules, "
        "'imported at registration'\n"
        "sys.modules['alfworld'] = None  # as if it were not installed\n"
        "try:\n"
        "    agentgym.make('alfworld-v0')\n"
        "except agentgym.ConfigError as exc:\n"
        "    print('ConfigError:', exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         check=True)
    assert "ConfigError:" in out.stdout and "agentgym-rl[alfworld]" in out.stdout, out.stdout + out.stderr


def test_served_over_http_like_a_local_env(cache_dir: Path) -> None:
    from fastapi.testclient import TestClient

    from agentgym.http.client import EnvClient, RemoteEnv
    from agentgym.http.server import create_app

    kwargs = {"num_games": POOL, "game_cache_dir": str(cache_dir), **SMALL}
    with TestClient(create_app([ENV_ID], num_workers=2)) as service:
        remote = RemoteEnv(ENV_ID, client=EnvClient(client=service), **kwargs)
        local = agentgym.make(ENV_ID, **kwargs)
        assert remote.reset(seed=9) == local.reset(seed=9)
        for action in ("not a command", "look"):
            assert remote.step(action) == local.step(action)
        while not local.episode_over:
            action = local.expert_action()
            assert remote.expert_action() == action
            assert remote.step(action) == local.step(action)
        remote.close()
        local.close()
