"""One run's warm start, another run's RL (``sft.from_run``): exactly the run that made it would have done."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from learning import small
from typer.testing import CliRunner

from agentgym.cli import app
from agentgym.errors import ConfigError
from agentgym.training.config.loading import load_config
from agentgym.training.config.schema import TrainConfig, config_to_dict
from agentgym.training.run.loop import train
from agentgym.training.run.warm_start import warm_start_fields

RUN = small("iterations=2")


def strip(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in history]


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return torch.load(folder / "checkpoint.pt", weights_only=False)["model"]


def assert_same_run(a: dict[str, Any], b: dict[str, Any], folder_a: Path, folder_b: Path) -> None:
    assert strip(a["history"]) == strip(b["history"])
    for when in ("before_sft", "before", "after"):
        assert a["eval"][when] == b["eval"][when], when
    assert a["sft"] == b["sft"]
    wa, wb = weights(folder_a), weights(folder_b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The quickstart's warm start alone (GiGPO config), made once for the module."""
    folder = tmp_path_factory.mktemp("warm")
    stopped = train(load_config(None, RUN), folder, stop_after=0)
    assert stopped["stopped_after"] == 0 and stopped["signal"] is None and stopped["checkpoint"]
    assert torch.load(folder / "checkpoint.pt", weights_only=False)["iteration"] == 0
    return folder


def test_rl_from_a_saved_warm_start_equals_the_run_that_made_it(warm: Path, tmp_path: Path) -> None:
    full = train(load_config(None, RUN), tmp_path / "full")
    adopted = train(load_config(None, [*RUN, f"sft.from_run={warm}"]), tmp_path / "adopted")
    assert_same_run(full, adopted, tmp_path / "full", tmp_path / "adopted")
    assert adopted["sft"]["sft/steps"] > 0  # the report says what SFT the weights had


def test_another_algorithm_starts_from_the_same_warm_start(warm: Path, tmp_path: Path) -> None:
    # GRPO with a KL term (its reference is the warm start) and its own learning rate and group size.
    grpo = [*RUN, "algorithm.name=grpo", "loss.kl_coef=0.05", "optim.lr=0.002",
            "rollout.group_size=3"]
    full = train(load_config(None, grpo), tmp_path / "full")
    adopted = train(load_config(None, [*grpo, f"sft.from_run={warm}"]), tmp_path / "adopted")
    assert_same_run(full, adopted, tmp_path / "full", tmp_path / "adopted")
    reference = torch.load(tmp_path / "adopted" / "reference.pt", weights_only=False)
    post_sft = torch.load(warm / "checkpoint.pt", weights_only=False)["model"]
    assert all(torch.equal(reference[k], post_sft[k]) for k in post_sft)


def test_a_run_from_a_warm_start_resumes_without_its_source(warm: Path, tmp_path: Path) -> None:
    source = tmp_path / "source"
    shutil.copytree(warm, source)
    adopt = [*RUN, f"sft.from_run={source}"]
    whole = train(load_config(None, adopt), tmp_path / "whole")
    train(load_config(None, adopt), tmp_path / "split", stop_after=1)
    shutil.rmtree(source)  # or moved past its warm start: a resumed run reads its own checkpoint only
    resumed = train(load_config(None, adopt), tmp_path / "split", resume=True)
    assert strip(resumed["history"]) == strip(whole["history"])
    assert resumed["eval"] == whole["eval"]


def test_lora_warm_start_carries_its_folded_base(tmp_path: Path) -> None:
    lora = [*RUN, "model.lora.r=4", "optim.lr=0.01", "loss.kl_coef=0.05"]
    train(load_config(None, lora), tmp_path / "warm", stop_after=0)
    full = train(load_config(None, lora), tmp_path / "full")
    adopted = train(load_config(None, [*lora, f"sft.from_run={tmp_path / 'warm'}"]), tmp_path / "adopted")
    assert strip(full["history"]) == strip(adopted["history"])
    assert full["eval"]["after"] == adopted["eval"]["after"]
    # The adopting run resumes like any other: its folder holds the post-SFT base it was built on.
    copied, made = (tmp_path / "adopted" / "reference.pt"), (tmp_path / "warm" / "reference.pt")
    assert copied.read_bytes() == made.read_bytes()


@pytest.mark.parametrize("override, message", [
    ("seed=1", r"seed \(0 there, 1 here\)"),
    ("sft.lr=0.5", r"sft.lr \(0.001 there, 0.5 here\)"),
    ("env.kwargs.size=3", r"env.kwargs.size"),
    ("optim.grad_clip=0.5", r"optim.grad_clip"),  # SFT clips its gradients too
])
def test_a_warm_start_made_with_other_settings_is_refused(warm: Path, tmp_path: Path, override: str,
                                                          message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        train(load_config(None, [*RUN, override, f"sft.from_run={warm}"]), tmp_path / "run")
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_warm_start_sources_that_cannot_serve_say_how_to_make_one(warm: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no run in .*--warm-start-only"):
        train(load_config(None, [*RUN, f"sft.from_run={tmp_path / 'nothing'}"]), tmp_path / "a")
    past = tmp_path / "past"
    train(load_config(None, RUN), past, stop_after=1)
    with pytest.raises(ConfigError, match=r"holds iteration 1, not the warm start"):
        train(load_config(None, [*RUN, f"sft.from_run={past}"]), tmp_path / "b")
    (past / "checkpoint.pt").unlink()
    with pytest.raises(ConfigError, match=r"holds no checkpoint"):
        train(load_config(None, [*RUN, f"sft.from_run={past}"]), tmp_path / "c")


def test_only_fields_rl_alone_reads_may_differ() -> None:
    defaults = config_to_dict(TrainConfig())
    base = warm_start_fields({}, defaults)
    free = {"iterations": 9, "algorithm": {"name": "grpo"}, "loss": {"kl_coef": 0.1}, "optim": {"lr": 0.1},
            "rollout": {"group_size": 2, "temperature": 0.7, "max_staleness": 1}, "eval": {"every": 3}}
    assert warm_start_fields(free, defaults) == base
    for read in ({"rollout": {"max_new_tokens": 7}}, {"eval": {"num_episodes": 3}}, {"model": {"path": "x"}},
                 {"optim": {"response_logits": True}}, {"sft": {"num_epochs": 9}}):
        assert warm_start_fields(read, defaults) != base, read


def test_cli_warm_start_only_then_from_run(tmp_path: Path) -> None:
    runner = CliRunner()
    args = [arg for item in small("iterations=1", "eval.before_sft=false") for arg in ("--set", item)]
    made = runner.invoke(app, ["train", *args, "--out", str(tmp_path / "warm"), "--warm-start-only"],
                         env={"COLUMNS": "300"})
    assert made.exit_code == 0, made.output
    assert "Warm start saved in" in made.output and "sft.from_run=" in made.output
    assert not (tmp_path / "warm" / "report.json").exists()
    both = runner.invoke(app, ["train", "--resume", str(tmp_path / "warm"), "--warm-start-only"])
    assert both.exit_code != 0 and "give one of them" in both.output
    rl = runner.invoke(app, ["train", *args, "--set", "algorithm.name=grpo",
                             "--set", f"sft.from_run={tmp_path / 'warm'}", "--out", str(tmp_path / "rl")],
                       env={"COLUMNS": "300"})
    assert rl.exit_code == 0, rl.output
    assert (tmp_path / "rl" / "report.json").is_file()
