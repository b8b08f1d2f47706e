"""Models by their Hugging Face Hub id, without a network: a hub cache the tests build in the cache's own
layout (``models--org--name/refs/<ref>`` holding a commit hash, ``snapshots/<hash>/`` the files), loaded by
``make_policy``, ``agentgym eval``, ``agentgym train`` and ``agentgym serve-policy``; the revision picks
the snapshot; an id that cannot be had fails in one line naming the id and what to do."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import yaml
from typer.testing import CliRunner

from agentgym.backends.builder import make_policy
from agentgym.backends.config import ModelConfig
from agentgym.backends.hub import as_hub_id, hub_cache_dir, parse_hub_id
from agentgym.backends.tiny import TinyModelConfig, build_tiny_model, save_tiny
from agentgym.backends.transformers_backend import TransformersPolicy
from agentgym.cli import app
from agentgym.errors import ConfigError
from agentgym.eval.policies import parse_policy
from agentgym.rollout.policy import SamplingParams
from agentgym.service_kit.launcher import free_port, start_service, stop_service

runner = CliRunner()
REPO = "acme/tiny-chat"
MAIN, V2 = "1" * 40, "2" * 40
#: The quickstart's model shape (a 256-token context its prompts fit); v2 has one layer more, so weights
#: saved from one do not load into the other.
SHAPE = dict(arch="llama", hidden_size=64, num_heads=4, num_kv_heads=2, intermediate_size=192,
             max_position_embeddings=256)


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A hub cache holding ``acme/tiny-chat`` at two commits: ``main`` (2 layers) and ``v2`` (3 layers)."""
    cache = tmp_path_factory.mktemp("hf") / "hub"
    repo = cache / "models--acme--tiny-chat"
    for commit, ref, layers in ((MAIN, "main", 2), (V2, "v2", 3)):
        save_tiny(*build_tiny_model(TinyModelConfig(num_layers=layers, **SHAPE)), repo / "snapshots" / commit)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return cache


@pytest.fixture
def offline(hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process sees the test cache, offline (agentgym reads the variables when it resolves an id)."""
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return hub_cache


def hub_env(cache: Path, **extra: str) -> dict[str, str]:
    """A child process's environment: the variables set before it starts, as a user sets them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    return {**env, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
            "COLUMNS": "250", **extra}


def layers(policy: Any) -> int:
    return int(policy.model.config.num_hidden_layers)


def one_line_error(result: Any) -> str:
    """The error of a failed command: one line, no traceback (eval prints its banner line first)."""
    lines = [line for line in result.output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert result.exit_code != 0 and len(errors) == 1 and errors[0] == lines[-1], result.output
    assert "Traceback" not in result.output and len(lines) <= 2, result.output
    return errors[0]


def closed_port() -> int:
    """A local port nothing listens on: connections to it are refused at once (no network needed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- what is a Hub id ---------------------------------------------------------------------------------


def test_only_org_slash_name_that_is_no_local_path_is_a_hub_id(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_hub_id("Qwen/Qwen2.5-0.5B-Instruct") is not None
    hub = parse_hub_id("Qwen/Qwen2.5-0.5B-Instruct@refs/pr/3")
    assert hub is not None and (hub.repo_id, hub.revision) == ("Qwen/Qwen2.5-0.5B-Instruct", "refs/pr/3")
    for text in ("smollm2", "model.gguf", "org/model.gguf", "./org/name", "/abs/org", "a/b/c", "org/name@",
                 "http://host/v1", "org--x/name", "org/na..me", "~/models"):
        assert parse_hub_id(text) is None, text
    monkeypatch.chdir(tmp_path)
    (tmp_path / "acme" / "tiny-chat").mkdir(parents=True)
    assert as_hub_id("acme/tiny-chat") is None  # an existing local path is a path
    assert as_hub_id("acme/other") is not None


def test_the_cache_is_where_the_variables_say_when_agentgym_looks(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hub_cache_dir() == tmp_path / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert hub_cache_dir() == tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert hub_cache_dir() == tmp_path / "elsewhere"


# --- loading -------------------------------------------------------------------------------------------


def test_a_policy_loads_by_hub_id_from_the_cache_and_generates(offline: Path) -> None:
    policy = make_policy(ModelConfig(path=REPO, device="cpu"))
    assert layers(policy) == 2
    saved, _ = build_tiny_model(TinyModelConfig(num_layers=2, **SHAPE))
    for name, tensor in saved.state_dict().items():  # the main snapshot's weights, not a fresh model
        assert torch.equal(policy.model.state_dict()[name], tensor), name
    prompt = policy.tokenizer.apply_chat_template([{"role": "user", "content": "go"}], tokenize=True,
                                                  add_generation_prompt=True)
    prompt = list(prompt["input_ids"] if isinstance(prompt, dict) or hasattr(prompt, "keys") else prompt)
    [generated] = policy.generate([prompt], SamplingParams(max_new_tokens=4, temperature=1.0, seed=0))
    assert len(generated.token_ids) >= 1 and len(generated.logprobs) == len(generated.token_ids)
    assert layers(TransformersPolicy.from_pretrained(REPO)) == 2


def test_a_revision_loads_its_own_snapshot(offline: Path) -> None:
    assert layers(make_policy(ModelConfig(path=REPO, revision="v2", device="cpu"))) == 3  # a second ref
    assert layers(make_policy(ModelConfig(path=f"{REPO}@v2", device="cpu"))) == 3
    assert layers(make_policy(ModelConfig(path=f"{REPO}@{V2}", device="cpu"))) == 3  # a commit hash
    assert layers(make_policy(ModelConfig(path=REPO, revision="main", device="cpu"))) == 2
    with pytest.raises(ConfigError, match="give the revision in one place"):
        make_policy(ModelConfig(path=f"{REPO}@v2", revision="main", device="cpu"))


def test_a_revision_needs_a_hub_id(offline: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="model.revision .* is not a Hub id"):
        ModelConfig(path="smollm2", revision="main")
    with pytest.raises(ConfigError, match="model.revision .* is not a Hub id"):
        ModelConfig(revision="main")
    monkeypatch.chdir(tmp_path)
    save_tiny(*build_tiny_model(TinyModelConfig(num_layers=1, **SHAPE)), tmp_path / REPO)
    assert layers(make_policy(ModelConfig(path=REPO, device="cpu"))) == 1  # the local folder, not the Hub's
    with pytest.raises(ConfigError, match="is a local path or a packaged model: remove model.revision"):
        make_policy(ModelConfig(path=REPO, revision="v2", device="cpu"))


def test_an_uncached_id_offline_fails_in_one_line_naming_the_id_and_the_variable(offline: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        make_policy(ModelConfig(path="acme/absent", device="cpu"))
    message = str(caught.value)
    assert "\n" not in message
    assert "'acme/absent' is not in the Hugging Face cache" in message and str(offline) in message
    assert "HF_HUB_OFFLINE=1 forbids downloading it" in message and "`hf download acme/absent`" in message
    with pytest.raises(ConfigError, match=r"revision 'v3'.*`hf download acme/tiny-chat --revision v3`"):
        make_policy(ModelConfig(path=REPO, revision="v3", device="cpu"))


def test_without_a_network_an_uncached_id_fails_in_one_line(offline: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")  # a Hub that refuses connections
    with pytest.raises(ConfigError) as caught:
        make_policy(ModelConfig(path="acme/absent", device="cpu"))
    message = str(caught.value)
    assert "\n" not in message and "'acme/absent' is not in the Hugging Face cache" in message
    assert "cannot be reached" in message and "ConnectError" in message
    # What is cached still loads when the Hub cannot be asked whether main moved.
    assert layers(make_policy(ModelConfig(path=REPO, device="cpu"))) == 2


# --- the commands ------------------------------------------------------------------------------------


def test_eval_takes_hub_ids_with_revisions(offline: Path, tmp_path: Path) -> None:
    out = tmp_path / "eval"
    result = runner.invoke(app, ["eval", "--policy", f"{REPO},max_new_tokens=8", "--policy",
                                 f"{REPO}@v2,max_new_tokens=8", "--envs", "maze-v0", "--env-arg",
                                 "maze-v0:size=2", "--episodes", "2", "--max-turns", "2", "--out", str(out)],
                           env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    assert sorted((r["policy"], r["episodes"]) for r in results["results"]) == [
        ("tiny-chat", 2), ("tiny-chat@v2", 2)]


def test_eval_of_an_uncached_id_offline_is_one_line(offline: Path, tmp_path: Path) -> None:
    assert parse_policy(f"{REPO}@v2,name=second").name == "second"
    spec = parse_policy(f"{REPO}@refs/pr/1")  # its label names files: no slash in it
    assert (spec.kind, spec.name, spec.location) == ("model", "tiny-chat@refs-pr-1", f"{REPO}@refs/pr/1")
    result = runner.invoke(app, ["eval", "--policy", "acme/absent", "--envs", "maze-v0", "--episodes", "1",
                                 "--out", str(tmp_path / "eval")], env={"COLUMNS": "250"})
    line = one_line_error(result)
    assert "'acme/absent' is not in the Hugging Face cache" in line and "HF_HUB_OFFLINE=1" in line


def test_a_run_trained_from_a_hub_id_records_it_and_resumes_and_evaluates_from_it(
        offline: Path, tmp_path: Path) -> None:
    config = tmp_path / "hub.yaml"
    config.write_text(yaml.safe_dump({"model": {"path": REPO, "revision": "v2"}, "env": {"id": "maze-v0",
                                      "kwargs": {"size": 2}, "max_turns": 2}, "algorithm": {"name": "grpo"}}))
    quick = ["iterations=1", "checkpoint_every=0", "rollout.num_tasks=1", "rollout.group_size=2",
             "rollout.max_new_tokens=8", "eval.num_episodes=1", "sft.enabled=false"]
    run = tmp_path / "run"
    sets = [arg for item in quick for arg in ("--set", item)]
    result = runner.invoke(app, ["train", str(config), *sets, "--out", str(run)], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    saved = json.loads((run / "config.json").read_text())["model"]
    assert (saved["path"], saved["revision"]) == (REPO, "v2")  # the id as written, not a cache folder
    assert json.loads((run / "model" / "config.json").read_text())["num_hidden_layers"] == 3

    # The checkpoint holds a 3-layer model: it fits only the v2 snapshot its config.json names.
    evaluated = runner.invoke(app, ["eval", "--policy", str(run / "checkpoint.pt"), "--episodes", "1",
                                    "--out", str(tmp_path / "eval")], env={"COLUMNS": "250"})
    assert evaluated.exit_code == 0, evaluated.output
    resumed = runner.invoke(app, ["train", "--resume", str(run), "--set", "iterations=2"],
                            env={"COLUMNS": "250"})
    assert resumed.exit_code == 0, resumed.output
    assert json.loads((run / "report.json").read_text())["iterations"] == 2


def test_serve_policy_serves_a_hub_id_under_its_id_with_the_variables_set_before_it_starts(
        hub_cache: Path, tmp_path: Path) -> None:
    """A child process, so huggingface_hub reads HF_HUB_OFFLINE and HF_HUB_CACHE at import as it would for
    a user who exported them."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serving = start_service([sys.executable, "-m", "agentgym", "serve-policy", f"{REPO}@v2", "--port",
                             str(port), "--device", "cpu"], url, timeout_s=180, env=hub_env(hub_cache),
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]] == [REPO]
        answer = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
            "model": REPO, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] >= 1
    finally:
        stop_service(serving)
    result = runner.invoke(app, ["serve-policy", "acme/absent", "--port", str(free_port())],
                           env={"COLUMNS": "250", "HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": "1"})
    line = one_line_error(result)
    assert "'acme/absent' is not in the Hugging Face cache" in line and "HF_HUB_OFFLINE=1" in line
