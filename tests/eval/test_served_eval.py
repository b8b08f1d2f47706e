"""A run served by `agentgym serve-policy RUN` is evaluated as its folder is: the server lists the run's env
and held-out task settings next to its prompt settings, and `agentgym eval` applies them through the
same path as a run folder's (the README's local and served commands, compared episode by episode)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import LiveServer
from typer.testing import CliRunner

from agentgym.backends.openai_server import create_policy_app
from agentgym.backends.tiny import TinyModelConfig, build_tiny_model, save_tiny
from agentgym.backends.transformers_backend import TransformersPolicy
from agentgym.cli import app
from agentgym.cli.evaluation import env_entries, served_run_notes
from agentgym.eval.plan import EnvEntry, EvalPlan
from agentgym.eval.policies import parse_policy
from agentgym.eval.store import EvalStore
from agentgym.service_kit.launcher import free_port, start_service, stop_service
from agentgym.training.config.loading import load_config
from agentgym.training.config.schema import config_to_dict

runner = CliRunner()
#: The quickstart's env (maze view and size from the default config) with its own turn budget and task
#: range, so that a served evaluation that missed any of them would play other episodes.
RUN_SETTINGS = ["env.max_turns=3", "eval.seed_offset=500000"]


def fabricated_run(folder: Path) -> Path:
    """A finished run's folder without the training: the default config's tiny model (untrained) and the
    config.json a run of ``RUN_SETTINGS`` writes, with an env token that must stay on the server."""
    config = config_to_dict(load_config(None, [*RUN_SETTINGS, "env.token=s3cret"]))
    save_tiny(*build_tiny_model(TinyModelConfig(**config["model"]["tiny"])), folder / "model")
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "report.json").write_text("{}")
    return folder


@pytest.fixture
def serve_policy() -> Iterator[Any]:
    """``serve_policy(RUN) -> URL``: `agentgym serve-policy RUN` on a free loopback port, stopped after."""
    processes: list[subprocess.Popen[Any]] = []

    def start(run: Path) -> str:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        processes.append(start_service([sys.executable, "-m", "agentgym", "serve-policy", str(run), "--port",
                                        str(port), "--device", "cpu"], url, timeout_s=120,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        return url

    yield start
    for process in processes:
        stop_service(process)


def evaluate(policy: str, out: Path, *flags: str) -> str:
    """`agentgym eval --policy POLICY ... --out OUT` as the README writes it; its output."""
    result = runner.invoke(app, ["eval", "--policy", policy, *flags, "--out", str(out)],
                           env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def episodes(out: Path, policy: str) -> list[tuple[int, bool, list[tuple[str, str, float]]]]:
    """Per episode: the seed, success, and every turn's response, action and reward."""
    return [(r["seed"], bool(r["success"]), [(t["response"], t["action"], t["reward"]) for t in r["turns"]])
            for r in EvalStore(out).records("maze-v0", policy)]


def local_and_served_agree(run: Path, url: str, tmp_path: Path, count: int) -> None:
    """The README's two evaluations of ``run`` (its folder; its server, without --envs) play the same
    tasks of the same env with the same settings, episode for episode."""
    local_out = evaluate(str(run), tmp_path / "local", "--episodes", str(count))
    served_out = evaluate(f"{url}/v1,name=served", tmp_path / "served", "--episodes", str(count))
    plans = [json.loads((tmp_path / kind / "plan.json").read_text()) for kind in ("local", "served")]
    config = json.loads((run / "config.json").read_text())
    env = config["env"]
    own = EnvEntry("maze-v0", env["kwargs"], env["max_turns"]).to_json()
    assert plans[0]["envs"] == plans[1]["envs"] == [own]
    start = config["eval"]["seed_offset"]
    assert plans[0]["seeds"] == plans[1]["seeds"] == list(range(start, start + count))
    assert plans[0]["policies"][0]["prompt"] == plans[1]["policies"][0]["prompt"]
    local, served = episodes(tmp_path / "local", run.name), episodes(tmp_path / "served", "served")
    assert len(local) == count and sum(len(turns) for _, _, turns in local) >= count
    assert served == local  # greedy: the same responses, actions, rewards and outcomes
    rows = [json.loads((tmp_path / kind / "results.json").read_text())["results"][0]
            for kind in ("local", "served")]
    assert rows[0]["success_rate"] == rows[1]["success_rate"] and rows[0]["episodes"] == rows[1]["episodes"]
    # The served evaluation says what it took from the run; the local one has nothing to say.
    kwargs = ", ".join(f"{k}={v}" for k, v in env["kwargs"].items())
    assert (f"policy 'served' serves an `agentgym train` run; from it: env maze-v0 ({kwargs}, "
            f"max_turns={env['max_turns']}); seeds {start}..{start + count - 1} (its eval.seed_offset); "
            "prompt settings (prompt_mode=current,") in served_out
    assert "serves an `agentgym train` run" not in local_out


def test_a_served_run_plays_its_env_settings_and_seeds_like_its_folder(tmp_path: Path,
                                                                        serve_policy: Any) -> None:
    run = fabricated_run(tmp_path / "run")
    url = serve_policy(run)
    [entry] = httpx.get(f"{url}/v1/models").json()["data"]
    assert entry["agentgym"]["run"] == {
        "env": {"id": "maze-v0", "kwargs": {"observation": "local", "size": 2}, "max_turns": 3},
        "eval": {"seed_offset": 500000}}  # and never the env token of the machine it trained on
    local_and_served_agree(run, url, tmp_path, count=4)

    # Flags win over the served run's settings as they do over a run folder's, and the note leaves them out.
    spec = parse_policy(f"{url}/v1,name=served,max_new_tokens=6")
    assert spec.run_config == entry["agentgym"]["run"]
    envs = env_entries(None, ["maze-v0:size=3"], [], None, 2, [spec])
    assert envs == [EnvEntry("maze-v0", {"observation": "local", "size": 3}, 2)]
    [line] = served_run_notes(EvalPlan((spec,), tuple(envs), (7, 8)), ["maze-v0:size=3"],
                              {"max_turns", "seeds"})
    assert line.startswith("policy 'served' serves an `agentgym train` run; from it: env maze-v0 "
                           "(observation=local); prompt settings (prompt_mode=current,")
    assert "max_new_tokens" not in line and "seeds" not in line
    # --envs: the envs named, with their own settings, as for a run folder.
    assert env_entries("sokoban-v0", [], [], None, None, [spec]) == [EnvEntry("sokoban-v0")]


def test_a_served_bare_model_brings_no_env_settings(tmp_path: Path) -> None:
    model = save_tiny(*build_tiny_model(TinyModelConfig(num_layers=1, hidden_size=32, intermediate_size=64)),
                      tmp_path / "model")
    live = LiveServer(create_policy_app(TransformersPolicy.from_pretrained(model), "bare", max_new_tokens=8))
    try:
        [entry] = httpx.get(f"{live.url}/v1/models").json()["data"]
        spec = parse_policy(f"{live.url}/v1")
        result = runner.invoke(app, ["eval", "--policy", f"{live.url}/v1", "--out", str(tmp_path / "out")])
    finally:
        live.stop()
    assert "agentgym" not in entry and spec.run_config is None
    assert result.exit_code == 2 and "give the envs to evaluate: --envs" in result.output


@pytest.mark.slow
def test_a_trained_run_scores_the_same_served_and_from_its_folder(tmp_path: Path, serve_policy: Any) -> None:
    """The README's shape end to end: `agentgym train` (shortened), then both evaluations."""
    from agentgym.training.run.loop import train

    overrides = ["iterations=2", "checkpoint_every=0", "rollout.num_tasks=2", "rollout.group_size=4",
                 "eval.num_episodes=6", *RUN_SETTINGS]
    train(load_config(None, overrides), tmp_path / "run")
    local_and_served_agree(tmp_path / "run", serve_policy(tmp_path / "run"), tmp_path, count=6)
