"""The task API over every built-in env: splits, ``task(split, index)``, reset by split and index, errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import agentgym
import agentgym.envs  # noqa: F401  (registers the built-in envs)
from agentgym.core import HELD_OUT_SEED_START, SEEDED_SPLITS, Env, TaskSplit
from agentgym.errors import ConfigError
from agentgym.harness.examples import arithmetic_tasks

#: The tasks the harness and MCP envs are made with: train and held-out parts, and named splits.
HARNESS_TASKS = arithmetic_tasks(3, seed=1) + arithmetic_tasks(2, seed=2, split="test")
MCP_TASKS = [{"id": "sum", "prompt": "What is 2.5 + 4?", "answer": 6.5, "split": "dev"},
             {"id": "capital", "prompt": "What is the capital of Ostavia?", "answer": "Lumen",
              "split": "dev"},
             {"id": "quotient", "prompt": "What is 9 / 4?", "answer": 2.25, "split": "final"},
             {"id": "brenmark", "prompt": "What is the capital of Brenmark?", "answer": "Harrow",
              "split": "final"}]

#: The smallest settings of the envs whose defaults are slow to make or reset here (the generated
#: TextWorld/ALFWorld games also get a cache folder of their own: ``game_cache_dir``).
SMALL_KWARGS: dict[str, dict[str, Any]] = {
    "search-qa-v0": {"num_entities": 40},
    "textworld-v0": {"challenge": "tw-coin_collector", "settings": {"level": 2}, "num_games": 2},
    "alfworld-v0": {"num_receptacles": 6, "num_distractors": 3, "num_games": 2,
                    "task_types": ["pick_and_place_simple"]},
    "webshop-v0": {"num_products": 40},
    "harness-v0": {"harness": "agentgym.harness.examples:tool_agent", "tasks": HARNESS_TASKS},
    "mcp-v0": {"tasks": MCP_TASKS},  # and the server: make_small asks conftest's fixture for it
}


@pytest.fixture(scope="module")
def game_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("game-cache")


@pytest.fixture(autouse=True)
def _no_official_alfworld_data(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)


def make_small(env_id: str, game_cache: Path, request: pytest.FixtureRequest | None = None,
               **kwargs: Any) -> agentgym.EpisodeGuard:
    kwargs = {**SMALL_KWARGS.get(env_id, {}), **kwargs}
    if env_id in ("textworld-v0", "alfworld-v0"):
        kwargs.setdefault("game_cache_dir", str(game_cache / env_id))
    if env_id == "mcp-v0" and request is not None:
        kwargs.setdefault("server_url", request.getfixturevalue("mcp_facts_url"))
    return agentgym.make(env_id, **kwargs)


def builtin_env_ids() -> set[str]:
    """The envs agentgym ships (other tests register envs of their own, whose entry points live in tests)."""
    return {spec.id for spec in agentgym.list_envs()
            if isinstance(spec.entry_point, str) and spec.entry_point.startswith("agentgym.")}


def made_env_ids() -> list[str]:
    return sorted(builtin_env_ids())


@pytest.fixture
def env(request: pytest.FixtureRequest, game_cache: Path) -> Iterator[agentgym.EpisodeGuard]:
    made = make_small(request.param, game_cache, request)
    yield made
    made.close()


def test_every_builtin_env_is_covered() -> None:
    assert {"maze-v0", "wordle-v0", "search-qa-v0", "code-tests-v0", "tools-v0", "webshop-v0", "harness-v0",
            "mcp-v0"} <= set(made_env_ids())


@pytest.mark.parametrize("env", made_env_ids(), indirect=True)
def test_splits_tasks_and_resets(env: agentgym.EpisodeGuard) -> None:
    splits = env.task_splits()
    assert splits and all(isinstance(split, TaskSplit) for split in splits)
    assert len({split.name for split in splits}) == len(splits)
    for split in splits:
        first = env.task(split.name, 0)
        assert json.loads(json.dumps(first)) == first  # JSON-safe
        assert first["split"] == split.name and first["index"] == 0
        assert isinstance(first["task_id"], str)
        assert env.task(split.name, 0) == first  # stable
        obs_a, info_a = env.reset(options={"split": split.name, "index": 0})
        obs_b, info_b = env.reset(seed=123, options={"split": split.name, "index": 0})
        assert obs_a == obs_b and info_a["task_id"] == info_b["task_id"] == first["task_id"]
        assert info_a["task_ref"] == {"split": split.name, "index": 0}
        _, info_other = env.reset(options={"split": split.name, "index": 1})
        assert info_other["task_id"] == env.task(split.name, 1)["task_id"] != first["task_id"]


@pytest.mark.parametrize("env", made_env_ids(), indirect=True)
def test_bad_split_and_index_name_the_valid_choices(env: agentgym.EpisodeGuard) -> None:
    splits = env.task_splits()
    names = [split.name for split in splits]
    with pytest.raises(ConfigError) as bad_split:
        env.reset(options={"split": "no-such-split", "index": 0})
    message = str(bad_split.value)
    assert "\n" not in message and "'no-such-split'" in message and all(name in message for name in names)
    bounded = next((split for split in splits if split.size is not None), None)
    if bounded is not None:
        with pytest.raises(ConfigError) as bad_index:
            env.task(bounded.name, bounded.size)
        assert "\n" not in str(bad_index.value) and f"0..{bounded.size - 1}" in str(bad_index.value)
    with pytest.raises(ConfigError, match="-1"):
        env.reset(options={"split": names[0], "index": -1})


def test_seeded_splits_are_disjoint_seed_ranges_split_at_the_held_out_start() -> None:
    from agentgym.sources.env_source import HELD_OUT_SEED_START as EVAL_HELD_OUT_SEED_START

    assert HELD_OUT_SEED_START == EVAL_HELD_OUT_SEED_START
    train, test = SEEDED_SPLITS
    assert (train.name, train.size, train.first_seed) == ("train", HELD_OUT_SEED_START, 0)
    assert (test.name, test.size, test.first_seed) == ("test", None, HELD_OUT_SEED_START)
    env = agentgym.make("maze-v0")
    assert env.task_splits() == SEEDED_SPLITS
    # Task i of a seeded split is the episode of its seed: test index 7 is seed 1_000_007.
    assert env.task("test", 7) == {"split": "test", "index": 7, "seed": 1_000_007,
                                   "task_id": "maze/size4/loop0.15/1000007",
                                   "description": "4x4 maze generated from seed 1000007"}
    obs_by_task, info = env.reset(options={"split": "test", "index": 7})
    obs_by_seed, _ = env.reset(seed=1_000_007)
    assert obs_by_task == obs_by_seed and info["task_id"] == "maze/size4/loop0.15/1000007"
    assert env.task("train", HELD_OUT_SEED_START - 1)["seed"] == HELD_OUT_SEED_START - 1
    # the test split is procedural: any index is a task
    assert env.task("test", 10**12)["seed"] == HELD_OUT_SEED_START + 10**12


def test_named_tasks_start_by_task_id() -> None:
    env = agentgym.make("code-tests-v0")
    (split,) = env.task_splits()
    assert (split.name, split.size, split.first_seed) == ("problems", 36, None)
    task = env.task("problems", 5)
    assert task == {"split": "problems", "index": 5, "task_id": "max_subarray",
                    "description": "Maximum subarray sum"}
    by_index = env.reset(options={"split": "problems", "index": 5})
    by_id = env.reset(options={"task_id": "max_subarray"})
    assert by_index[0] == by_id[0]
    words = agentgym.make("wordle-v0")
    assert words.task("words", 3)["task_id"] == "wordle/idx3"
    assert words.reset(options={"split": "words", "index": 3})[1]["task_id"] == "wordle/idx3"


def test_function_calling_splits_hold_even_and_odd_task_numbers() -> None:
    env = agentgym.make("tools-v0", families=["convert", "transfer"])
    train, test = env.task_splits()
    assert (train.name, test.name, train.size) == ("train", "test", 2 * 2**30)
    # families take turns: index 3 is the second family's second task of its parity
    assert env.task("train", 3)["task_id"] == "tools/transfer/2"
    assert env.task("test", 3)["task_id"] == "tools/transfer/3"


def test_tictactoe_task_knows_who_moves_first() -> None:
    env = agentgym.make("tictactoe-v0", first_player="random")
    for index in range(6):
        described = env.task("train", index)
        assert env.reset(options={"split": "train", "index": index})[1]["task_id"] == described["task_id"]


def test_task_options_are_checked() -> None:
    env = agentgym.make("maze-v0")
    with pytest.raises(ConfigError, match="'index' is missing"):
        env.reset(options={"split": "train"})
    with pytest.raises(ConfigError, match="both 'task_id' and 'split'"):
        env.reset(options={"split": "train", "index": 0, "task_id": "maze/size4/loop0.15/0"})
    with pytest.raises(ConfigError, match="out of range"):
        env.task("train", "3")
    with pytest.raises(ConfigError, match="out of range"):
        env.task("train", True)


def test_a_forked_episode_plays_the_same_task() -> None:
    env = agentgym.make("sokoban-v0")
    obs, _ = env.reset(options={"split": "test", "index": 2})
    child = env.fork()
    assert child.render() == env.render() and child.episode_seed == HELD_OUT_SEED_START + 2


def test_an_env_without_task_api_code_gets_the_seeded_splits() -> None:
    class Coin(Env):
        def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
            super().reset(seed=seed)
            side = "heads" if self.np_random.random() < 0.5 else "tails"
            return side, {"state_key": side, "seed": seed, "options": options}

    coin = Coin()
    _, info = coin.reset(seed=4, options={"split": "test", "index": 9, "bias": 1})
    assert (info["seed"], info["options"], info["task_ref"]) == (
        HELD_OUT_SEED_START + 9, {"bias": 1}, {"split": "test", "index": 9})
    _, plain = coin.reset(seed=4, options={"bias": 1})
    assert (plain["seed"], plain["options"], "task_ref" in plain) == (4, {"bias": 1}, False)


def test_textworld_pool_is_one_split_of_its_game_seeds(game_cache: Path) -> None:
    env = make_small("textworld-v0", game_cache, game_seed_offset=40)
    (pool,) = env.task_splits()
    assert (pool.name, pool.size, pool.first_seed) == ("pool", 2, None)
    assert env.task("pool", 1)["task_id"] == "tw-coin_collector/level=2/seed41"
    procedural = make_small("textworld-v0", game_cache, num_games=None, game_seed_offset=40)
    assert procedural.task_splits() == SEEDED_SPLITS
    assert procedural.task("train", 1)["task_id"] == "tw-coin_collector/level=2/seed41"


def test_alfworld_has_the_official_splits_whichever_it_was_made_with(game_cache: Path) -> None:
    env = make_small("alfworld-v0", game_cache, split="valid_unseen")
    assert [(s.name, s.size) for s in env.task_splits()] == [
        ("train", 2), ("valid_seen", 2), ("valid_unseen", 2)]
    assert env.task("valid_seen", 1)["task_id"] == "gen-r6-d3/valid_seen/pick_and_place_simple/seed1"
    default_sizes = make_small("alfworld-v0", game_cache, num_games=None)
    assert [s.size for s in default_sizes.task_splits()] == [3553, 140, 134]


def test_alfworld_data_folder_splits_are_the_folders_it_has(game_cache: Path, tmp_path: Path) -> None:
    from agentgym.envs.alfworld import generation as gen

    small = {"num_receptacles": 6, "num_distractors": 3, "task_types": ["pick_and_place_simple"]}
    gen.write_dataset(tmp_path, {"train": 2, "valid_seen": 1}, cache_dir=game_cache / "alfworld-v0", **small)
    env = agentgym.make("alfworld-v0", data_dir=str(tmp_path), **small)
    assert [(s.name, s.size) for s in env.task_splits()] == [("train", 2), ("valid_seen", 1)]
    task = env.task("valid_seen", 0)
    assert task["task_id"].startswith("valid_seen/pick_and_place_simple-")
    _, info = env.reset(options={"split": "valid_seen", "index": 0})
    assert info["task_id"] == task["task_id"] and info["task_ref"] == {"split": "valid_seen", "index": 0}
    with pytest.raises(ConfigError, match=r"valid indices: 0\.\.0$"):
        env.reset(options={"split": "valid_seen", "index": 1})
    with pytest.raises(ConfigError, match="valid splits: train .0..1., valid_seen .0..0.$"):
        env.task("valid_unseen", 0)
    env.close()


def test_envs_tasks_lists_every_env_split_and_size() -> None:
    from typer.testing import CliRunner

    from agentgym.cli import app

    result = CliRunner().invoke(app, ["envs", "--tasks"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in result.output.splitlines()
            if line.startswith("│")]
    by_env: dict[str, list[tuple[str, str]]] = {}
    for env_id, split, size, _ in rows:
        by_env.setdefault(env_id, []).append((split, size))
    assert by_env["maze-v0"] == [("train", "1000000"), ("test", "procedural")]
    assert by_env["code-tests-v0"] == [("problems", "36")]
    assert by_env["wordle-v0"] == [("words", "2023")]
    assert by_env["harness-v0"] == [("-", "-")]  # needs harness=: the row says why instead
    assert "not made with default arguments" in result.output
    assert set(made_env_ids()) <= set(by_env)


def test_envs_tasks_env_id_shows_the_first_tasks_of_each_split() -> None:
    from typer.testing import CliRunner

    from agentgym.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["envs", "--tasks", "code-tests-v0", "--first", "2"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    lines = [line.strip() for line in result.output.splitlines()]
    assert lines[0].startswith("problems  36 tasks")
    assert lines[1:] == ["0  is_palindrome  Palindrome check", "1  fizzbuzz  FizzBuzz"]
    bad = runner.invoke(app, ["envs", "--tasks", "maze-v9"])
    assert bad.exit_code == 2 and "maze-v0" in bad.output


def test_service_task_routes_and_remote_env(make_service: Any) -> None:
    from agentgym.http.client import EnvClient, RemoteEnv

    service = make_service(["maze-v0", "code-tests-v0", "test/http-counter-v0"])
    splits = service.get("/envs/code-tests-v0/tasks")
    assert splits.status_code == 200, splits.text
    assert splits.json() == {"splits": [{"name": "problems", "size": 36, "first_seed": None,
                                         "description": "problems of the bundled problem set, in order"}]}
    task = service.get("/envs/code-tests-v0/tasks/problems/1")
    assert task.json() == {"split": "problems", "index": 1, "task_id": "fizzbuzz", "description": "FizzBuzz"}
    # namespaced ids (with a slash) reach the task routes, not the env detail route
    assert [s["name"] for s in service.get("/envs/test/http-counter-v0/tasks").json()["splits"]] == [
        "train", "test"]
    bad = service.get("/envs/code-tests-v0/tasks/problems/36")
    assert bad.status_code == 422 and bad.json()["error"]["type"] == "ConfigError"
    assert "valid indices: 0..35" in bad.json()["error"]["message"]
    assert service.get("/envs/sokoban-v0/tasks").status_code == 404  # not served here
    assert service.get("/envs/maze-v0").json()["id"] == "maze-v0"  # the detail route still answers

    client = EnvClient(client=service)
    assert client.task_splits("maze-v0") == SEEDED_SPLITS
    assert client.task("maze-v0", "test", 2)["seed"] == HELD_OUT_SEED_START + 2
    with RemoteEnv("code-tests-v0", client=client) as remote:
        local = agentgym.make("code-tests-v0")
        assert remote.task_splits() == local.task_splits()
        assert remote.task("problems", 5) == local.task("problems", 5)
        # reset options split/index travel to the service as they are and start the same task
        remote_obs, remote_info = remote.reset(options={"split": "problems", "index": 5})
        local_obs, local_info = local.reset(options={"split": "problems", "index": 5})
        assert (remote_obs, remote_info["task_id"], remote_info["task_ref"]) == (
            local_obs, local_info["task_id"], local_info["task_ref"])
        with pytest.raises(ConfigError, match="has no task split 'nope'; valid splits: problems"):
            remote.reset(options={"split": "nope", "index": 0})
        with pytest.raises(ConfigError, match=r"valid indices: 0\.\.35"):
            remote.task("problems", 99)


def test_webshop_holds_out_the_first_goals_as_test() -> None:
    env = agentgym.make("webshop-v0", num_products=40)
    train, test = env.task_splits()
    # a 40-goal catalog holds out a tenth: goals 0..3 are test, goals 4..39 train
    assert [(s.name, s.size) for s in (train, test)] == [("train", 36), ("test", 4)]
    assert env.task("test", 3)["task_id"] == "webshop/gen-s0-n40/3"
    assert env.task("train", 0)["task_id"] == "webshop/gen-s0-n40/4"
    assert env.task("train", 35)["task_id"] == "webshop/gen-s0-n40/39"
    ids = [env.task(s.name, i)["task_id"] for s in (train, test) for i in range(s.size)]
    assert len(set(ids)) == 40  # disjoint, and every goal is a task of one split
    catalog = env.unwrapped.catalog
    assert env.task("test", 1)["description"] == catalog.goals[1].instruction
    obs, info = env.reset(options={"split": "train", "index": 2})
    assert info["task_id"] == "webshop/gen-s0-n40/6" and catalog.goals[6].instruction in obs
    while (action := env.expert_action()) is not None:  # the task started is the one that scores
        _, reward, terminated, _, info = env.step(action)
    assert (reward, terminated) == (1.0, True)
    # WebShop's own count from 5,000 goals on; the default catalog (500 goals) holds out 50
    assert [s.size for s in agentgym.make("webshop-v0").task_splits()] == [450, 50]
    assert [s.name for s in agentgym.make("webshop-v0", num_products=1).task_splits()] == ["train"]


def test_harness_splits_are_its_training_and_held_out_tasks(tmp_path: Path) -> None:
    env = agentgym.make("harness-v0", **SMALL_KWARGS["harness-v0"])
    try:
        assert [(s.name, s.size) for s in env.task_splits()] == [("train", 3), ("test", 2)]
        assert env.task("test", 1) == {"split": "test", "index": 1, "task_id": "arith-2-1"}
        obs, info = env.reset(options={"split": "test", "index": 1})
        assert info["task_id"] == "arith-2-1" and HARNESS_TASKS[4]["question"] in obs
        assert env.reset(options={"split": "train", "index": 2})[1]["task_id"] == "arith-1-2"
    finally:
        env.close()
    # held-out tasks from their own file are ids eval-<i>, apart from the training tasks' task-<i>
    held = tmp_path / "held.jsonl"
    held.write_text('{"question": "What is 2 + 2?"}\n{"question": "What is 3 + 3?"}\n')
    separate = agentgym.make("harness-v0", harness="agentgym.harness.examples:tool_agent",
                             tasks=[{"question": "What is 1 + 1?"}], eval_tasks=str(held))
    assert [separate.task("test", i)["task_id"] for i in range(2)] == ["eval-0", "eval-1"]
    assert separate.task("train", 0)["task_id"] == "task-0"
    alone = agentgym.make("harness-v0", harness="agentgym.harness.examples:tool_agent",
                          tasks=arithmetic_tasks(2))
    assert [s.name for s in alone.task_splits()] == ["train"]  # no held-out tasks: no test split
    with pytest.raises(ConfigError, match="'a' names both a training task and a different held-out task"):
        agentgym.make("harness-v0", harness="agentgym.harness.examples:tool_agent",
                      tasks=[{"id": "a", "question": "1?"}], eval_tasks=[{"id": "a", "question": "2?"}])


def test_mcp_splits_are_the_task_files_split_values(mcp_facts_url: str) -> None:
    env = agentgym.make("mcp-v0", tasks=MCP_TASKS, server_url=mcp_facts_url)
    try:
        assert [(s.name, s.size) for s in env.task_splits()] == [("dev", 2), ("final", 2)]
        assert env.task("final", 1) == {"split": "final", "index": 1, "task_id": "brenmark",
                                        "description": "What is the capital of Brenmark?"}
        obs, info = env.reset(options={"split": "final", "index": 0})
        assert (obs, info["task_id"], info["answer"]) == ("What is 9 / 4?", "quotient", 2.25)
    finally:
        env.close()
    plain = agentgym.make("mcp-v0", tasks=[{"prompt": "1?", "answer": 1}, {"prompt": "2?", "answer": 2}],
                          server_url=mcp_facts_url)
    try:
        (split,) = plain.task_splits()
        assert (split.name, split.size, plain.task("tasks", 1)["task_id"]) == ("tasks", 2, "task-1")
    finally:
        plain.close()
    mixed = agentgym.make("mcp-v0", tasks=[{"prompt": "1?", "answer": 1, "split": "dev"},
                                           {"prompt": "2?", "answer": 2}], server_url=mcp_facts_url)
    assert [(s.name, s.size) for s in mixed.task_splits()] == [("dev", 1), ("tasks", 1)]
