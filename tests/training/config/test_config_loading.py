"""Loading configs the way users write them: YAML 1.1 numbers, retargeting the quickstart to another
algorithm or env, errors that name the path the user wrote, and presets by name."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import agentgym
from agentgym.errors import ConfigError
from agentgym.training import load_config, register_algorithm
from agentgym.training.run.quickstart import QUICKSTART


def test_yaml_1_1_numbers_written_as_strings_are_numbers(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    # YAML 1.1 (PyYAML) reads 1e-4 and 5e-4 as strings: no dot before the exponent.
    path.write_text("optim:\n  lr: 1e-4\nsft:\n  lr: 5e-4\nloss:\n  kl_coef: 1e-3\niterations: 1e1\n")
    cfg = load_config(path)
    assert (cfg.optim.lr, cfg.sft.lr, cfg.loss.kl_coef, cfg.iterations) == (1e-4, 5e-4, 1e-3, 10)
    assert isinstance(cfg.iterations, int)


def test_a_number_with_a_fraction_is_not_an_integer(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("iterations: 2.5e0\n")
    with pytest.raises(ConfigError, match="iterations must be an integer"):
        load_config(path)


# --- retargeting the quickstart ----------------------------------------------------------------------


def test_another_algorithm_starts_from_its_own_defaults_with_a_note() -> None:
    notes: list[str] = []
    cfg = load_config(None, ["algorithm.name=grpo"], on_note=notes.append)
    assert cfg.algorithm.name == "grpo" and cfg.algorithm.args == {}
    assert len(notes) == 1
    assert "gigpo" in notes[0] and "gamma" in notes[0] and "grpo" in notes[0]


def test_arguments_given_with_the_new_algorithm_are_kept() -> None:
    notes: list[str] = []
    cfg = load_config(None, ["algorithm.name=grpo", "algorithm.args.normalize_std=false"],
                      on_note=notes.append)
    assert cfg.algorithm.args == {"normalize_std": False}
    assert len(notes) == 1 and "gamma, mode, invalid_action_penalty" in notes[0]
    with pytest.raises(ConfigError, match="algorithm.args.gamma"):  # gigpo's argument, written for grpo
        load_config(None, ["algorithm.name=grpo", "algorithm.args.gamma=0.9"])


def test_naming_the_same_algorithm_keeps_its_arguments() -> None:
    notes: list[str] = []
    cfg = load_config(None, ["algorithm.name=gigpo"], on_note=notes.append)
    assert cfg.algorithm.args == QUICKSTART["algorithm"]["args"] and notes == []


def test_another_env_drops_the_old_envs_settings_with_a_note() -> None:
    notes: list[str] = []
    cfg = load_config(None, ["env.id=tools-v0"], on_note=notes.append)
    assert cfg.env.id == "tools-v0" and cfg.env.kwargs == {} and cfg.env.max_turns is None
    assert len(notes) == 1 and "maze-v0" in notes[0] and "size" in notes[0] and "max_turns" in notes[0]
    env = agentgym.make(cfg.env.id, max_turns=cfg.env.max_turns, **cfg.env.kwargs)
    env.reset(seed=0)
    env.close()


def test_settings_given_with_the_new_env_are_kept() -> None:
    notes: list[str] = []
    cfg = load_config(None, ["env.id=sokoban-v0", "env.kwargs.size=5", "env.max_turns=7"],
                      on_note=notes.append)
    assert cfg.env.kwargs == {"size": 5} and cfg.env.max_turns == 7
    assert len(notes) == 1 and "env.kwargs: observation" in notes[0] and "max_turns" not in notes[0]


# --- errors name the path the user wrote --------------------------------------------------------------


@dataclass(frozen=True)
class RangedArgs:
    gamma: float = 0.9
    """Discount in [0, 1]."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.gamma <= 1.0:
            raise ConfigError(f"RangedArgs.gamma must be in [0, 1], got {self.gamma}")


register_algorithm("test_ranged", lambda groups, args: np.zeros(0), RangedArgs, override=True)


@pytest.mark.parametrize("value, message", [
    ("2", "algorithm.args.gamma must be in [0, 1], got 2.0"),
    ("often", "algorithm.args.gamma must be a number, got 'often'"),
])
def test_algorithm_argument_errors_name_algorithm_args(value: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, ["algorithm.name=test_ranged", f"algorithm.args.gamma={value}"])
    assert str(info.value) == message


def test_a_preset_loads_by_name() -> None:
    assert load_config("quickstart_maze_grpo").algorithm.name == "grpo"
    assert load_config("quickstart_maze_grpo.yaml").algorithm.name == "grpo"


def test_a_run_folders_config_json_loads_back(tmp_path: Path) -> None:
    """``config.json`` (what ``--resume`` and the restart command read) gives the same config, variable-length
    tuples included."""
    import json

    from agentgym.training import config_to_dict

    cfg = load_config(None, ["rollout.stop_strings=['</search>', '</answer>']"])
    (tmp_path / "config.json").write_text(json.dumps(config_to_dict(cfg)))
    assert load_config(tmp_path / "config.json") == cfg
    assert load_config(None, ["rollout.stop_strings=[]"]).rollout.stop_strings == ()


def test_gspo_has_one_spelling_and_the_old_one_says_which() -> None:
    assert load_config(None, ["loss.loss_mode=gspo"]).loss.loss_mode == "gspo"
    with pytest.raises(ConfigError, match=r"'loss.sequence_ratio' no longer exists: .*loss.loss_mode=gspo"):
        load_config(None, ["loss.sequence_ratio=true"])


@pytest.mark.parametrize("variant", ["grpo", "arpo"])
def test_the_smollm2_search_presets_are_what_the_algorithm_benchmark_runs(monkeypatch, variant: str) -> None:
    """``configs/search_qa_<variant>_smollm2.yaml`` is that variant's row of ``benchmarks/algorithms.py
    --model smollm2 --tasks search-qa2`` written out: a change to either that the other lacks fails here."""
    import importlib
    from dataclasses import replace

    root = Path(__file__).resolve().parents[3]
    monkeypatch.syspath_prepend(str(root / "benchmarks"))
    algorithms = importlib.import_module("algorithms")
    composed = load_config(algorithms.preset("search-qa2", variant),
                           [*algorithms.TASKS["search-qa2"][0], *algorithms.MODELS["smollm2"]])
    shipped = load_config(f"search_qa_{variant}_smollm2")
    assert shipped.model.path == "smollm2"
    # the tiny model's shape is unused once model.path names a model; the run length is the benchmark's flag,
    # and the benchmark skips the untrained model's evaluation
    composed = replace(composed, model=replace(composed.model, tiny=shipped.model.tiny),
                       iterations=shipped.iterations, eval=replace(composed.eval, before_sft=True))
    assert composed == shipped


def test_an_override_whose_value_is_broken_yaml_gets_one_line_saying_where() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, ["rollout.group_size=[4,"])
    message = str(caught.value)
    assert "override 'rollout.group_size=[4,': value is not valid YAML (line 1, column 4:" in message
    assert "\n" not in message


# --- paths written in a config --------------------------------------------------------------------------


def _config_folder(tmp_path: Path) -> tuple[Path, Path]:
    """A config in its own folder, naming files beside it, and an unrelated working folder."""
    folder, working = tmp_path / "project" / "configs", tmp_path / "elsewhere"
    (folder / "model").mkdir(parents=True)
    working.mkdir()
    (folder / "tasks.jsonl").write_text('{"id": "t0", "question": "2 + 2?", "answer": 4}\n')
    (folder / "run.yaml").write_text(
        "model:\n  path: model\n"
        "env:\n  harness: agentgym.harness.examples:tool_agent\n  tasks: tasks.jsonl\n"
        "  kwargs:\n    eval_tasks: ../held_out.jsonl\n"
        "  judge:\n    base_url: http://127.0.0.1:9/v1\n    model: judge\n    rubric: solved?\n"
        "    cache_file: verdicts.jsonl\n"
        "sft:\n  from_run: ../runs/warm\n")
    return folder, working


def test_relative_paths_in_a_config_file_are_read_from_its_folder(tmp_path: Path, monkeypatch) -> None:
    from agentgym.harness import load_tasks

    folder, working = _config_folder(tmp_path)
    monkeypatch.chdir(working)
    cfg = load_config(folder / "run.yaml")
    assert cfg.env.tasks == str(folder / "tasks.jsonl")
    assert cfg.env.kwargs["eval_tasks"] == str(tmp_path / "project" / "held_out.jsonl")
    assert cfg.env.judge is not None and cfg.env.judge.cache_file == str(folder / "verdicts.jsonl")
    assert cfg.sft.from_run == str(tmp_path / "project" / "runs" / "warm")
    assert cfg.model.path == str(folder / "model")  # a folder beside the config
    assert load_tasks(cfg.env.tasks)[0]["id"] == "t0"
    # the same file named relative to the working folder reads the same files
    assert load_config(Path("..") / "project" / "configs" / "run.yaml") == cfg


def test_a_path_given_with_set_is_read_from_the_working_folder(tmp_path: Path, monkeypatch) -> None:
    folder, working = _config_folder(tmp_path)
    monkeypatch.chdir(working)
    cfg = load_config(folder / "run.yaml", ["env.tasks=mine.jsonl", "sft.from_run=runs/warm",
                                            "env.judge.cache_file=/var/verdicts.jsonl"])
    assert cfg.env.tasks == str(working / "mine.jsonl")
    assert cfg.sft.from_run == str(working / "runs" / "warm")
    assert cfg.env.judge is not None and cfg.env.judge.cache_file == "/var/verdicts.jsonl"  # absolute: as is
    assert cfg.model.path == str(folder / "model")  # not overridden: still the file's
    assert load_config(None, ["sft.from_run=warm"]).sft.from_run == str(working / "warm")


def test_a_model_name_is_not_taken_for_a_path(tmp_path: Path, monkeypatch) -> None:
    """``model.path`` is a path only when written as one or when it exists: a packaged model's name and a Hub
    id stay as written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.yaml").write_text("model:\n  path: smollm2\n")
    assert load_config(tmp_path / "run.yaml").model.path == "smollm2"
    hub_id = "Qwen/Qwen2.5-0.5B-Instruct"
    assert load_config(None, [f"model.path={hub_id}"]).model.path == hub_id
    assert load_config(None, ["model.path=./Qwen"]).model.path == str(tmp_path / "Qwen")


def test_env_arguments_named_like_paths_are_paths(tmp_path: Path) -> None:
    from agentgym.training.config.loading import resolve_paths

    data = {"env": {"id": "webshop-v0", "kwargs": {"data_dir": "shop", "game_cache_dir": "/cache",
                                                    "eval_tasks": "held.jsonl", "num_products": 10}}}
    kwargs = resolve_paths(data, tmp_path)["env"]["kwargs"]
    # eval_tasks is a file for the harness env only
    assert kwargs == {"data_dir": str(tmp_path / "shop"), "game_cache_dir": "/cache",
                      "eval_tasks": "held.jsonl", "num_products": 10}
    assert data["env"]["kwargs"]["data_dir"] == "shop"  # the input is left as it was
