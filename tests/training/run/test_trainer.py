"""The training loop on CPU: parameters move, runs resume exactly, reports are written, it learns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from learning import SMALL

from agentgym.errors import ConfigError
from agentgym.training.api.turn_table import TurnTable
from agentgym.training.config.loading import load_config
from agentgym.training.run.collection import SyncCollection
from agentgym.training.run.loop import Trainer, flatten, train
from agentgym.training.run.quickstart import QUICKSTART

ROOT = Path(__file__).resolve().parents[3]



def test_preset_file_equals_embedded_quickstart() -> None:
    assert yaml.safe_load((ROOT / "configs" / "quickstart_maze_gigpo.yaml").read_text()) == QUICKSTART


def test_every_trainable_parameter_changes_and_loss_is_finite(tmp_path: Path) -> None:
    cfg = load_config(None, [*SMALL, "sft.enabled=false", "loss.entropy_coef=0.01", "loss.kl_coef=0"])
    run = Trainer(cfg, tmp_path)
    assert type(run.collection) is SyncCollection  # rollout.max_staleness: 0, chosen once at set-up
    try:
        groups = run.collector.collect([1, 2], 4, run.sampling(1.0, 0))
        turns = flatten(groups)
        # Non-zero advantages on every turn so every parameter gets a gradient.
        advantages = torch.linspace(-1.0, 1.0, len(turns)).numpy()
        before = {n: p.detach().clone() for n, p in run.model.named_parameters() if p.requires_grad}
        metrics = run.update(turns, advantages, TurnTable.from_groups(groups), 1)
        for key in ("loss/policy", "loss/total", "loss/entropy", "loss/grad_norm"):
            assert torch.isfinite(torch.tensor(metrics[key])), key
        unchanged = [n for n, p in run.model.named_parameters()
                     if p.requires_grad and torch.equal(p, before[n])]
        assert not unchanged, f"parameters not updated: {unchanged}"
    finally:
        run.close()


def test_resume_is_exact(tmp_path: Path) -> None:
    overrides = [*SMALL, "loss.kl_coef=0.05", "optim.schedule=cosine"]
    full = train(load_config(None, overrides), tmp_path / "full")
    train(load_config(None, overrides), tmp_path / "split", stop_after=2)
    resumed = train(load_config(None, overrides), tmp_path / "split", resume=True)

    def strip(h: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in h]

    assert strip(resumed["history"]) == strip(full["history"])
    assert resumed["eval"]["after"] == full["eval"]["after"]
    a = torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "split" / "checkpoint.pt", weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    logged = [json.loads(line) for line in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in logged] == [1, 2, 3, 4]


def test_report_and_outputs(tmp_path: Path) -> None:
    report = train(load_config(None, [*SMALL, "iterations=2"]), tmp_path)
    on_disk = json.loads((tmp_path / "report.json").read_text())
    assert on_disk["algorithm"] == "gigpo" and on_disk["env"] == "maze-v0" and on_disk["iterations"] == 2
    for when in ("before", "after"):
        assert set(on_disk["eval"][when]) >= {"success_rate", "episodes", "mean_return", "mean_turns"}
        assert on_disk["eval"][when]["episodes"] == 4
    assert len(report["history"]) == 2 and report["wall_time_s"] > 0
    assert (tmp_path / "learning_curve.png").stat().st_size > 1000
    assert len(list((tmp_path / "trajectories").glob("iter_*.jsonl"))) == 2
    assert (tmp_path / "model" / "config.json").is_file()
    assert on_disk["eval"]["before_sft"]["episodes"] == 4  # SFT ran: the untrained model was evaluated too


def test_the_evaluation_before_sft_can_be_skipped(tmp_path: Path) -> None:
    report = train(load_config(None, [*SMALL, "iterations=1", "eval.before_sft=false"]), tmp_path)
    assert report["eval"]["before_sft"] is None  # SFT ran; the untrained model was not evaluated
    assert report["eval"]["before"]["episodes"] == 4 and report["eval"]["after"]["episodes"] == 4
    assert report["sft"]["sft/steps"] > 0


@pytest.mark.parametrize("override, field", [
    ("rollout.group_size=1", "rollout.group_size"),
    ("rollout.gruop_size=4", "Did you mean rollout.group_size"),
    ("optim.lr=-1", "optim.lr"),
    ("algorithm.name=gipgo", "Did you mean 'gigpo'"),
    ("algorithm.args.gama=0.9", "Did you mean algorithm.args.gamma"),
    ("algorithm.args.mode=bogus", "algorithm.args.mode must be one of"),
    ("loss.loss_mode=gpso", "Did you mean 'gspo'"),
    ("loss.kl_type=k4", "loss.kl_type must be one of"),
    ("loss.terms.nope.coef=1", "no loss term named 'nope'"),
    ("algorithm.hooks.nope.x=1", "no rollout-hook option named 'nope'"),
    ("model.tiny.hidden_size=90", "model.tiny.hidden_size (90) must be divisible"),
    ("model.backend=vlm", "model.backend 'vlm' is not a registered backend"),
    ("rollout.prompt_mode=chat", "rollout.prompt_mode must be one of"),
    ("loss.dual_clip_c=0.5", "loss.dual_clip_c"),
    ("iterations=many", "iterations must be an integer"),
])
def test_config_errors_name_the_field(override: str, field: str) -> None:
    with pytest.raises(Exception) as info:
        load_config(None, [override])
    assert isinstance(info.value, (ConfigError,)) or "RegistryError" in type(info.value).__name__
    assert field in str(info.value)


def test_missing_config_file_lists_presets() -> None:
    with pytest.raises(ConfigError, match="shipped presets .*quickstart_maze_gigpo"):
        load_config("no/such/file.yaml")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_regression_pin_quickstart_learns_seed0(tmp_path: Path) -> None:
    """The main job: GiGPO raises held-out success by at least 25 points over the SFT policy."""
    report = train(load_config(None), tmp_path)
    before, after = report["eval"]["before"]["success_rate"], report["eval"]["after"]["success_rate"]
    assert before < 0.6, f"the SFT warm start should leave the policy clearly imperfect, got {before:.0%}"
    assert after - before >= 0.25, f"held-out success {before:.0%} -> {after:.0%}"


@pytest.mark.parametrize("preset", sorted(p.name for p in (ROOT / "configs").glob("*.yaml")))
def test_every_preset_validates(preset: str) -> None:
    cfg = load_config(ROOT / "configs" / preset)
    assert cfg.iterations >= 1
