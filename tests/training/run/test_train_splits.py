"""Training over named task splits: ``env.train_split`` and ``eval.split`` route a run's seed ranges to
tasks of the env's splits (``RoutedTaskEnv``), and `agentgym eval` of such a run plays its split."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from learning import small
from typer.testing import CliRunner

import agentgym
from agentgym.cli import app
from agentgym.errors import ConfigError
from agentgym.sources.task_split import RoutedTaskEnv, TaskRoute
from agentgym.training.config.loading import load_config
from agentgym.training.run.loop import Trainer, train
from agentgym.training.run.setup import env_factory

WEBSHOP = ["env.id=webshop-v0", "env.kwargs={num_products: 60}", "env.max_turns=3",
           "rollout.max_new_tokens=8", "sft.enabled=false"]
"""A small catalog: 60 products, whose goals split 54 train / 6 test (WebShop's tenth held out)."""


def split_sizes(env_id: str, **kwargs: object) -> dict[str, int | None]:
    return {split.name: split.size for split in agentgym.make(env_id, **kwargs).task_splits()}


def test_routes_send_each_seed_range_to_its_split() -> None:
    cfg = load_config(None, small(*WEBSHOP, "env.train_split=train", "eval.split=test"))
    env = env_factory(cfg)()
    try:
        refs = {seed: env.reset(seed=seed)[1]["task_ref"]
                for seed in (0, 53, cfg.eval.seed_offset, cfg.eval.seed_offset + 5, cfg.sft.seed_offset,
                             cfg.sft.seed_offset + 54 + 2)}
    finally:
        env.close()
    assert refs == {0: {"split": "train", "index": 0}, 53: {"split": "train", "index": 53},
                    cfg.eval.seed_offset: {"split": "test", "index": 0},
                    cfg.eval.seed_offset + 5: {"split": "test", "index": 5},
                    cfg.sft.seed_offset: {"split": "train", "index": 0},
                    # demonstrations round again past the split's 54 tasks
                    cfg.sft.seed_offset + 56: {"split": "train", "index": 2}}
    assert split_sizes("webshop-v0", num_products=60) == {"train": 54, "test": 6}


def test_a_route_without_a_split_passes_seeds_through() -> None:
    routed = RoutedTaskEnv(agentgym.make("maze-v0"), [TaskRoute(0, None), TaskRoute(10, "test")])
    plain = agentgym.make("maze-v0")
    assert routed.reset(seed=7)[0] == plain.reset(seed=7)[0]
    obs, info = routed.reset(seed=12)
    assert info["task_ref"] == {"split": "test", "index": 2}
    assert obs == plain.reset(seed=1_000_002)[0]  # maze's test split: held-out seeds from 1,000,000


def test_training_draws_training_tasks_and_evaluates_the_held_out_split(tmp_path: Path) -> None:
    cfg = load_config(None, small(*WEBSHOP, "env.train_split=train", "eval.split=test", "rollout.num_tasks=6",
                                  "eval.num_episodes=64"))
    run = Trainer(cfg, tmp_path)
    try:
        groups, _, _ = run.collect(1)
        held_out = run.evaluate("check")
        assert run.held_out_episodes == 6  # all of the 6-task test split, not eval.num_episodes=64
    finally:
        run.close()
    assert all(0 <= g.seed < 54 for g in groups)
    assert {t.first_info["task_ref"]["split"] for g in groups for t in g.trajectories} == {"train"}
    assert held_out["episodes"] == 6


def test_the_curriculum_pool_is_drawn_from_the_split_and_holds_all_of_a_small_one(tmp_path: Path) -> None:
    overrides = small(*WEBSHOP, "env.train_split=train", "rollout.task_sampler=curriculum",
                      "rollout.curriculum.pool_size=54")
    run = Trainer(load_config(None, overrides), tmp_path / "fits")
    try:
        assert run.task_sampler.pool.tolist() == list(range(54))
    finally:
        run.close()
    # A pool larger than the split pools all of it.
    run = Trainer(load_config(None, small(*overrides, "rollout.curriculum.pool_size=256")), tmp_path / "all")
    try:
        assert run.task_sampler.pool.tolist() == list(range(54))
    finally:
        run.close()
    few = small("env.train_split=test", *WEBSHOP, "rollout.task_sampler=curriculum", "rollout.num_tasks=8")
    with pytest.raises(ConfigError, match="env.train_split 'test' has 6 tasks, fewer than the"):
        Trainer(load_config(None, few), tmp_path / "few")


@pytest.mark.parametrize(("overrides", "message"), [
    (["env.train_split=validation"],
     "env.train_split: webshop-v0 has no task split 'validation'; valid splits:"),
    (["eval.split=dev"], "eval.split: webshop-v0 has no task split 'dev'"),
])
def test_an_unknown_split_is_a_one_line_error_naming_the_key(tmp_path: Path, overrides: list[str],
                                                              message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        Trainer(load_config(None, small(*WEBSHOP, *overrides)), tmp_path)
    assert message in str(raised.value) and "\n" not in str(raised.value)
    assert "agentgym envs --tasks webshop-v0" in str(raised.value)


@pytest.mark.parametrize(("overrides", "message"), [
    (["env.train_split=test", "eval.split=test"], "would score training tasks"),
    (["env.train_split=train", "sft.seed_offset=5"], "must start above the held-out ones"),
    (["eval.split=test", "env.backend=ray"], "cannot be combined with env.backend: ray"),
    (["env.train_split=''"], "env.train_split must name a task split"),
])
def test_inconsistent_split_settings_are_refused_when_loaded(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(None, small(*overrides))
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_agentgym_eval_of_a_run_plays_its_held_out_split(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    train(load_config(None, small(*WEBSHOP, "env.train_split=train", "eval.split=test", "iterations=1",
                                  "eval.num_episodes=3")), run_dir)
    result = CliRunner().invoke(app, ["eval", "--policy", str(run_dir), "--episodes", "3",
                                      "--out", str(tmp_path / "eval")])
    assert result.exit_code == 0, result.output
    lines = (tmp_path / "eval").glob("**/*.jsonl")
    records = [json.loads(line) for path in lines for line in path.read_text().splitlines()]
    assert sorted((r["split"], r["index"]) for r in records) == [("test", 0), ("test", 1), ("test", 2)]
