"""Model policies in the evaluation harness: a local model directory, the same model served over the
OpenAI-compatible API (chat and completions), training run folders and checkpoints (numbers equal to
report.json's), and every way an endpoint or a model directory can be wrong."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import LiveServer

from agentgym.backends.openai_backend import PolicyEndpointError
from agentgym.backends.openai_server import create_policy_app
from agentgym.backends.tiny import TinyModelConfig, build_tiny_model, save_tiny
from agentgym.backends.transformers_backend import TransformersPolicy
from agentgym.errors import ConfigError
from agentgym.eval.harness import Evaluation
from agentgym.eval.plan import EnvEntry, EvalError, EvalPlan
from agentgym.eval.policies import parse_policy
from agentgym.eval.store import EvalStore
from agentgym.service_kit.launcher import free_port
from agentgym.training.config.loading import load_config
from agentgym.training.run.loop import train

TINY = TinyModelConfig(num_layers=1, hidden_size=64, intermediate_size=128, max_position_embeddings=1024)
MAZE = (EnvEntry("maze-v0", {"size": 2, "observation": "local"}, max_turns=3),)
SHORT = ",max_new_tokens=6,prompt_mode=current,include_instructions=false"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model, tokenizer = build_tiny_model(TINY)
    return save_tiny(model, tokenizer, tmp_path_factory.mktemp("tiny") / "tiny")


@pytest.fixture(scope="module")
def served(model_dir: Path) -> Iterator[LiveServer]:
    live = LiveServer(create_policy_app(TransformersPolicy.from_pretrained(model_dir), "tiny",
                                        max_new_tokens=64))
    yield live
    live.stop()


def turns_of(out: Path, policy: str) -> list[list[tuple[str, str, float]]]:
    return [[(t["response"], t["action"], t["reward"]) for t in r["turns"]]
            for r in EvalStore(out).records("maze-v0", policy)]


@pytest.mark.parametrize("mode", ["current", "full"])
def test_local_model_and_the_same_model_served_play_identical_episodes(tmp_path: Path, model_dir: Path,
                                                                       served: LiveServer, mode: str) -> None:
    short = SHORT.replace("prompt_mode=current", f"prompt_mode={mode}")  # full: the chat history is spliced
    policies = (parse_policy(f"{model_dir},name=local{short}"),
                parse_policy(f"{served.url}/v1,name=chat{short}"),
                parse_policy(f"{served.url}/v1,name=completions,api=completions,tokenizer={model_dir}{short}"))
    results = Evaluation(EvalPlan(policies, MAZE, tuple(range(5)), concurrency=4), tmp_path).run()
    local = turns_of(tmp_path, "local")
    assert sum(map(len, local)) >= 5
    assert turns_of(tmp_path, "chat") == local  # the endpoint saw the same prompts (its chat template)
    assert turns_of(tmp_path, "completions") == local  # token ids out, token ids back
    rows = {r["policy"]: r for r in results["results"]}
    assert (rows["local"]["tokens_generated"] == rows["chat"]["tokens_generated"]
            == rows["completions"]["tokens_generated"] > 0)
    first = EvalStore(tmp_path).records("maze-v0", "local")[0]["turns"][0]
    assert first["prompt"].startswith("<|im_start|>") and first["response_ids"]
    chat_first = EvalStore(tmp_path).records("maze-v0", "chat")[0]["turns"][0]
    assert chat_first["prompt"].startswith("[") and chat_first["tokens"] == len(first["response_ids"])


def test_prompts_that_outgrow_an_endpoints_context_end_the_episode_like_local_ones(tmp_path: Path) -> None:
    model, tokenizer = build_tiny_model(TinyModelConfig(num_layers=1, hidden_size=32, intermediate_size=64,
                                                        max_position_embeddings=200))
    live = LiveServer(create_policy_app(TransformersPolicy(model, tokenizer), "small", max_new_tokens=8))
    try:
        spec = parse_policy(f"{live.url}/v1,max_new_tokens=8,prompt_mode=full,include_instructions=false")
        results = Evaluation(EvalPlan((spec,), (EnvEntry("maze-v0", {"size": 2}, max_turns=20),), (0, 1)),
                             tmp_path).run()
    finally:
        live.stop()
    episodes = EvalStore(tmp_path).records("maze-v0", spec.name)
    assert len(episodes) == 2 and results["results"][0]["truncation_rate"] == 1.0
    assert all(e["note"] == "the prompt outgrew the model's context" and e["turns"] for e in episodes)


def test_run_folder_and_checkpoint_reproduce_the_training_report(tmp_path: Path) -> None:
    overrides = ["iterations=2", "checkpoint_every=0", "rollout.num_tasks=2", "rollout.group_size=4",
                 "eval.num_episodes=6", "sft.num_episodes=4", "sft.num_epochs=2", "env.max_turns=4"]
    report = train(load_config(None, overrides), tmp_path / "run")
    after = report["eval"]["after"]
    from agentgym.cli.evaluation import env_entries

    specs = [parse_policy(str(tmp_path / "run")), parse_policy(str(tmp_path / "run" / "checkpoint.pt"))]
    envs = env_entries(None, [], [], None, None, specs)
    assert envs == [EnvEntry("maze-v0", {"size": 2, "observation": "local"}, 4)]  # the run's own env settings
    seeds = tuple(range(1_000_000, 1_000_006))  # eval.seed_offset: the tasks report.json was measured on
    results = Evaluation(EvalPlan(tuple(specs), tuple(envs), seeds, concurrency=4), tmp_path / "eval").run()
    for row in results["results"]:  # chunks of 4 tasks, still the same greedy episodes
        for key in ("episodes", "success_rate", "mean_return", "mean_turns", "invalid_rate",
                    "tokens_generated"):
            assert row[key] == pytest.approx(after[key]), (row["policy"], key)


def test_model_directory_without_tokenizer_or_chat_template(tmp_path: Path, model_dir: Path) -> None:
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(model_dir, bare)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (bare / name).unlink()

    def plan(p: Path) -> EvalPlan:
        return EvalPlan((parse_policy(str(p)),), MAZE, (0,))

    with pytest.raises(ConfigError, match="has no tokenizer files .* save the tokenizer there"):
        Evaluation(plan(bare), tmp_path / "a").run()
    templateless = tmp_path / "templateless"
    shutil.copytree(model_dir, templateless)
    (templateless / "chat_template.jinja").unlink()
    config = json.loads((templateless / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (templateless / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="has no chat template"):
        Evaluation(plan(templateless), tmp_path / "b").run()
    with pytest.raises(ConfigError, match="neither config.json .* nor checkpoint.pt"):
        parse_policy(str(tmp_path))


# --- endpoints that misbehave: real servers, scripted --------------------------------------------


def scripted_server(mode: str, good_replies: int) -> LiveServer:
    """A chat server that answers "inc" (the counter's winning move) ``good_replies`` times, then
    misbehaves: ``garbage`` (a JSON body that is no completion), ``error`` (HTTP 500), ``slow`` (3 s)."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    app = FastAPI()
    served = [0]
    lock = threading.Lock()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list",
                "data": [{"id": "scripted", "object": "model", "created": 0, "owned_by": "t"}]}

    @app.post("/v1/chat/completions")
    def chat(body: dict[str, Any]) -> Any:
        with lock:
            served[0] += 1
            n = served[0]
        if n > good_replies:
            if mode == "garbage":
                return {"hello": "world"}
            if mode == "error":
                return JSONResponse({"error": {"message": "CUDA out of memory", "type": "server_error"}}, 500)
            time.sleep(3)
        return {"id": "x", "object": "chat.completion", "created": 0, "model": "scripted",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "inc"},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}

    return LiveServer(app)


COUNTER = (EnvEntry("test/http-counter-v0"),)  # 4 "inc" per episode win it


@pytest.mark.parametrize("mode, match", [
    ("garbage", "returned something that is not an OpenAI chat completion"),
    ("error", "answered HTTP 500: CUDA out of memory"),
    ("slow", "timed out after 0.5 s"),
])
def test_endpoint_failing_mid_run_is_one_line_and_keeps_finished_episodes(tmp_path: Path, mode: str,
                                                                          match: str) -> None:
    live = scripted_server(mode, good_replies=8)
    try:
        spec = parse_policy(f"{live.url}/v1,max_retries=0,timeout_s=0.5")
        with pytest.raises(EvalError) as caught:
            Evaluation(EvalPlan((spec,), COUNTER, tuple(range(5)), concurrency=1), tmp_path).run()
    finally:
        live.stop()
    message = str(caught.value)
    assert "\n" not in message and match in message and "task seed 2, sample 0" in message
    assert f"{live.url}/v1 (POST /chat/completions)" in message and "--resume" in message
    saved = EvalStore(tmp_path).records("test/http-counter-v0", "127.0.0.1:" + live.url.rsplit(":", 1)[1])
    assert [r["seed"] for r in saved] == [0, 1] and all(r["success"] for r in saved)


def test_unreachable_endpoint_and_unknown_model_fail_before_any_episode(tmp_path: Path,
                                                                        served: LiveServer) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(PolicyEndpointError,
                       match=rf"policy endpoint {url} \(GET /models\) is unreachable .*start the server"):
        Evaluation(EvalPlan((parse_policy(f"{url},max_retries=0"),), COUNTER, (0,)), tmp_path / "a").run()
    with pytest.raises(ConfigError, match="does not serve model 'gpt-4'; it serves tiny"):
        Evaluation(EvalPlan((parse_policy(f"{served.url}/v1,model=gpt-4"),), COUNTER, (0,)),
                   tmp_path / "b").run()
    assert not (tmp_path / "a" / "plan.json").exists() and not (tmp_path / "b" / "plan.json").exists()
