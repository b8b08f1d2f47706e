"""The run folder: every file a training run or an evaluation writes is one ``RunFolder`` names, under the
names earlier runs used."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from learning import small

from agentgym.errors import ConfigError
from agentgym.eval.harness import Evaluation
from agentgym.eval.plan import EnvEntry, EvalPlan
from agentgym.eval.policies import parse_policy
from agentgym.run_folder import EVAL_LAYOUT, LAYOUT, RUN_FILES, RunFolder
from agentgym.training.config.loading import load_config
from agentgym.training.run.loop import train

#: The names on disk: runs written before any change must stay readable, so they never change.
NAMES = {"config": "config.json", "history": "config_history.jsonl", "checkpoint": "checkpoint.pt",
         "reference": "reference.pt", "metrics": "metrics.jsonl", "tensorboard": "tensorboard",
         "tracking": "tracking.json", "mlruns": "mlruns", "wandb": "wandb", "trajectories": "trajectories",
         "report": "report.json", "curve": "learning_curve.png",
         "model": "model", "adapter": "adapter"}
#: An evaluation's names, under the same rule.
EVAL_NAMES = {"plan": "plan.json", "timing": "timing.json", "results": "results.json",
              "report_md": "report.md", "report_html": "report.html"}


def _accessors(folder: RunFolder, names: dict[str, str] = NAMES) -> dict[str, Path]:
    """Every path property of ``RunFolder`` that ``names`` lists (a training run's or an evaluation's), read
    on ``folder``."""
    return {name: getattr(folder, name) for name, attr in vars(RunFolder).items()
            if isinstance(attr, property) and name in names}


def _listing(path: Path) -> set[str]:
    return {p.name for p in path.iterdir()}


def test_each_accessor_names_one_entry_of_the_layout_under_its_old_name(tmp_path: Path) -> None:
    properties = {name for name, attr in vars(RunFolder).items() if isinstance(attr, property)}
    assert properties == set(NAMES) | set(EVAL_NAMES)
    accessors = _accessors(RunFolder(tmp_path), {**NAMES, **EVAL_NAMES})
    assert {name: path.relative_to(tmp_path).as_posix() for name, path in accessors.items()} == {
        **NAMES, **EVAL_NAMES}
    assert sorted(LAYOUT) == sorted(NAMES.values())
    assert sorted(EVAL_LAYOUT) == sorted([*EVAL_NAMES.values(), "trajectories"])
    assert RunFolder("run").trajectory_file(12).as_posix() == "run/trajectories/iter_00012.jsonl"
    assert RunFolder("out").episode_file("acme/maze-v0", "run@x").as_posix() == \
        "out/trajectories/acme__maze-v0/run@x.jsonl"


def test_an_evaluation_writes_exactly_the_files_its_run_folder_names(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path / "eval")
    plan = EvalPlan((parse_policy("expert"),), (EnvEntry("maze-v0", {"size": 2}),), (0, 1))
    Evaluation(plan, folder.path).run()
    assert _listing(folder.path) == set(EVAL_LAYOUT)
    assert folder.episode_files() == [folder.episode_file("maze-v0", "expert")]
    assert folder.kind() == "eval" and not folder.holds_run()  # a training run never starts over it
    assert RunFolder(tmp_path / "none").kind() is None


def test_only_files_no_other_tool_writes_mark_a_folder_as_a_run(tmp_path: Path) -> None:
    for name in LAYOUT:
        folder = RunFolder(tmp_path / name)
        folder.path.mkdir()
        (folder.path / name).touch()
        assert folder.holds_run() == (name in RUN_FILES), name
    # An evaluation's trajectories/, a model's folders, a TensorBoard log, an MLflow store, a W&B folder
    # or a plot are not a run's.
    assert set(LAYOUT) - set(RUN_FILES) == {"trajectories", "model", "adapter", "tensorboard", "mlruns",
                                            "wandb", "learning_curve.png"}


def test_trajectory_files_lists_the_iterations_in_order_and_skips_other_names(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    folder.trajectories.mkdir()
    for iteration in (100_000, 2, 10):
        folder.trajectory_file(iteration).touch()
    (folder.trajectories / "iter_x.jsonl").touch()
    (folder.trajectories / "iter_00003.jsonl.tmp").touch()
    assert folder.trajectory_files() == [(i, folder.trajectory_file(i)) for i in (2, 10, 100_000)]


def test_a_real_run_writes_exactly_the_files_its_run_folder_names(tmp_path: Path) -> None:
    """A writer that bypasses ``RunFolder`` with a name of its own fails this."""
    folder = RunFolder(tmp_path / "run")
    train(load_config(None, small("iterations=2", "model.device=cpu")), folder.path)
    has_tensorboard = importlib.util.find_spec("tensorboard") is not None
    # Not written by this run: a config changed on resume, a LoRA adapter, the trackers' files (tracking is
    # off by default; tests/training/run/test_tracking.py checks them); TensorBoard only when installed.
    expected = {p.name for p in _accessors(folder).values()} - {
        folder.history.name, folder.adapter.name, folder.tracking.name, folder.mlruns.name, folder.wandb.name}
    if not has_tensorboard:
        expected.discard(folder.tensorboard.name)
    assert _listing(folder.path) == expected
    assert _listing(folder.trajectories) == {folder.trajectory_file(i).name for i in (1, 2)}
    assert folder.has_model() and folder.checkpoint.is_file() and folder.reference.is_file()

    # Resuming with more iterations records the change: now the history is there too, and nothing else.
    train(load_config(None, small("iterations=3", "model.device=cpu")), folder.path, resume=True)
    assert _listing(folder.path) == expected | {folder.history.name}
    assert _listing(folder.trajectories) == {folder.trajectory_file(i).name for i in (1, 2, 3)}
    assert [entry["changes"] for entry in folder.config_history()] == [{"iterations": {"from": 2, "to": 3}}]


def test_a_run_without_a_kl_term_writes_no_reference_and_still_resumes(tmp_path: Path) -> None:
    """The reference is a full copy of the model (538 MB for a 135 M model): only a run whose loss compares
    with it keeps one."""
    folder = RunFolder(tmp_path / "run")
    overrides = ["model.device=cpu", "loss.kl_coef=0"]
    train(load_config(None, small("iterations=1", *overrides)), folder.path)
    assert folder.checkpoint.is_file() and not folder.reference.exists()
    report = train(load_config(None, small("iterations=2", *overrides)), folder.path, resume=True)
    assert len(report["history"]) == 2 and not folder.reference.exists()


@pytest.mark.parametrize("name", sorted(RUN_FILES))
def test_a_folder_holding_one_run_file_is_refused_as_a_new_run(tmp_path: Path, name: str) -> None:
    folder = RunFolder(tmp_path)
    (tmp_path / name).touch()
    with pytest.raises(ConfigError, match="holds a run"):
        folder.check_new(overwrite=False)
