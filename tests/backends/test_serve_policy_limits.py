"""`agentgym serve-policy` as a service: size and batch limits, bounded numbers, CPU work off the event
loop, OpenAI-shaped errors that keep the connection, the token, adapter directories, the command's checks."""

from __future__ import annotations

import copy
import json
import os
import pickle
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from conftest import LiveServer
from typer.testing import CliRunner

from agentgym.backends.config import TinyModelConfig
from agentgym.backends.openai_server import create_policy_app
from agentgym.backends.tiny import build_tiny_model, save_tiny
from agentgym.backends.transformers_backend import TransformersPolicy
from agentgym.cli import app
from agentgym.service_kit.launcher import free_port

TINY = TinyModelConfig(num_layers=1, hidden_size=64, intermediate_size=128, max_position_embeddings=512)
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
runner = CliRunner()


@pytest.fixture(scope="module")
def policy() -> TransformersPolicy:
    return TransformersPolicy.from_pretrained(TINY, seed=0)


@pytest.fixture
def serve(policy: TransformersPolicy) -> Iterator[Any]:
    """``serve(**create_policy_app_kwargs) -> LiveServer``; every server is stopped after the test."""
    servers: list[LiveServer] = []

    def start(served: TransformersPolicy | None = None, **kwargs: Any) -> LiveServer:
        servers.append(LiveServer(create_policy_app(served or policy, "tiny", max_new_tokens=16, **kwargs)))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def error_of(answer: httpx.Response) -> dict[str, Any]:
    """The ``error`` object of an OpenAI-shaped error answer (asserting the shape)."""
    body = answer.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def exchange(sock: socket.socket, request: bytes) -> tuple[int, bytes]:
    """Send one HTTP/1.1 request on ``sock`` and read its answer (status, body); the connection stays open."""
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection mid-answer")
        body += chunk
    return int(head.split(b" ")[1]), body


def post(path: str, payload: dict[str, Any], port: int) -> bytes:
    data = json.dumps(payload).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


# --- limits ------------------------------------------------------------------------------------


def test_a_body_over_the_limit_gets_413_in_openai_shape_sized_or_streamed(serve: Any) -> None:
    server = serve(max_body_bytes=4096)
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}
    answer = httpx.post(f"{server.url}/v1/chat/completions", json=big)
    assert answer.status_code == 413 and "--max-body-bytes" in error_of(answer)["message"]
    streamed = httpx.post(f"{server.url}/v1/chat/completions", content=iter([json.dumps(big).encode()]),
                          headers={"content-type": "application/json"})  # chunked: no Content-Length
    assert streamed.status_code == 413 and error_of(streamed)["code"] == "request_too_large"
    assert httpx.post(f"{server.url}/v1/chat/completions", json=CHAT).status_code == 200


def test_prompts_times_n_is_capped_with_a_400_that_says_which_limit(serve: Any) -> None:
    server = serve(max_request_rows=4)
    ok = httpx.post(f"{server.url}/v1/completions", json={"model": "tiny", "prompt": ["a", "b"], "n": 2,
                                                          "max_tokens": 1})
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 4
    answer = httpx.post(f"{server.url}/v1/completions", json={"model": "tiny", "prompt": ["a"] * 600, "n": 16,
                                                              "max_tokens": 1})
    error = error_of(answer)
    assert answer.status_code == 400
    assert "9600 sequences" in error["message"] and "--max-request-rows" in error["message"]


def test_every_number_in_the_request_schemas_is_bounded(serve: Any) -> None:
    schemas = httpx.get(f"{serve().url}/openapi.json").json()["components"]["schemas"]
    unbounded = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if node.get("type") in ("integer", "number"):
                low = "minimum" in node or "exclusiveMinimum" in node
                high = "maximum" in node or "exclusiveMaximum" in node
                if not (low and high):
                    unbounded.append(where)
            for key, value in node.items():
                walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}[{i}]")

    for name in ("CompletionRequest", "ChatRequest", "LoraLoadRequest"):
        walk(schemas[name], name)
    assert unbounded == []


@pytest.mark.parametrize("field, value", [("seed", 2**64), ("top_k", 2**63), ("presence_penalty", 1e300)])
def test_numbers_out_of_range_are_a_400_naming_the_field(serve: Any, field: str, value: Any) -> None:
    server = serve()
    answer = httpx.post(f"{server.url}/v1/completions",
                        json={"model": "tiny", "prompt": "hi", "max_tokens": 1, field: value})
    assert answer.status_code == 400 and error_of(answer)["param"] == field
    if field == "seed":  # the largest seed the schema allows still samples n distinct continuations
        largest = httpx.post(f"{server.url}/v1/completions", json={"model": "tiny", "prompt": "hi", "n": 3,
                                                                   "seed": 2**63 - 1, "temperature": 1})
        assert largest.status_code == 200 and len(largest.json()["choices"]) == 3


# --- CPU work off the event loop -----------------------------------------------------------------


@pytest.mark.parametrize("route, method", [("/v1/chat/completions", "apply_chat_template"),
                                           ("/v1/completions", "encode")])
def test_tokenizing_runs_off_the_event_loop(serve: Any, route: str, method: str) -> None:
    """While one request is inside the tokenizer, /health and other requests are answered."""
    model, tokenizer = build_tiny_model(TINY)
    entered, release = threading.Event(), threading.Event()
    original = getattr(tokenizer, method)

    def gated(*args: Any, **kwargs: Any) -> Any:
        if "slow" in json.dumps(args[0], default=str):
            entered.set()
            release.wait(60)  # held until the test has seen the server answer meanwhile
        return original(*args, **kwargs)

    setattr(tokenizer, method, gated)
    server = serve(TransformersPolicy(model, tokenizer))
    body = {"model": "tiny", "max_tokens": 1, **({"messages": [{"role": "user", "content": "slow"}]}
                                                  if method == "apply_chat_template" else {"prompt": "slow"})}
    result: dict[str, Any] = {}
    worker = threading.Thread(
        target=lambda: result.update(answer=httpx.post(f"{server.url}{route}", json=body, timeout=90)))
    worker.start()
    try:
        assert entered.wait(60)
        assert httpx.get(f"{server.url}/health", timeout=20).status_code == 200
        assert httpx.get(f"{server.url}/v1/models", timeout=20).status_code == 200
    finally:
        release.set()
        worker.join(90)
    assert result["answer"].status_code == 200


def test_text_that_cannot_fit_the_context_is_refused_without_tokenizing(serve: Any) -> None:
    model, tokenizer = build_tiny_model(TINY)
    calls: list[str] = []
    for method in ("encode", "apply_chat_template"):
        original = getattr(tokenizer, method)
        setattr(tokenizer, method, lambda *a, _o=original, _m=method, **k: calls.append(_m) or _o(*a, **k))
    server = serve(TransformersPolicy(model, tokenizer))
    text = "x" * 1_000_000
    answer = httpx.post(f"{server.url}/v1/completions",
                        json={"model": "tiny", "prompt": text, "max_tokens": 1})
    assert answer.status_code == 400
    assert "cannot fit the model's context of 512 tokens" in error_of(answer)["message"]
    chat = httpx.post(f"{server.url}/v1/chat/completions",
                      json={**CHAT, "messages": [{"role": "user", "content": text}]})
    assert chat.status_code == 400 and error_of(chat)["param"] == "messages"
    assert calls == []


# --- errors keep the connection -------------------------------------------------------------------


def save_adapter(policy: TransformersPolicy, folder: Path, *, pickled: bool = False) -> Path:
    """A real PEFT LoRA adapter for ``policy``'s model; ``pickled``: its weights file replaced by a pickle
    that names a callable (what a hostile adapter_model.bin looks like; this one is harmless)."""
    from agentgym.backends.config import LoraConfig
    from agentgym.backends.lora import apply_lora

    adapted = apply_lora(copy.deepcopy(policy.model), LoraConfig(r=2, target_modules=("q_proj", "v_proj")))
    adapted.save_pretrained(folder)
    if pickled:
        (folder / "adapter_model.safetensors").unlink()
        (folder / "adapter_model.bin").write_bytes(pickle.dumps({"weights": os.getpid}))
    return folder


def test_a_pickled_adapter_and_a_huge_seed_are_400s_and_the_connection_stays_usable(
        serve: Any, policy: TransformersPolicy, tmp_path: Path) -> None:
    pickled = save_adapter(policy, tmp_path / "pickled", pickled=True)
    server = serve()  # adapters from anywhere, as in-process users create it
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        load = {"lora_name": "p", "lora_path": str(pickled)}
        status, body = exchange(sock, post("/v1/load_lora_adapter", load, server.port))
        assert status == 400 and "adapter_model.bin is a pickle" in json.loads(body)["error"]["message"]
        huge_seed = {"model": "tiny", "prompt": "hi", "seed": 2**64}
        status, body = exchange(sock, post("/v1/completions", huge_seed, server.port))
        assert status == 400 and json.loads(body)["error"]["param"] == "seed"
        status, _ = exchange(sock, post("/v1/chat/completions", CHAT, server.port))  # same connection
        assert status == 200


def test_a_failure_inside_the_server_is_a_500_in_openai_shape_and_the_connection_stays_usable(
        serve: Any, policy: TransformersPolicy) -> None:
    class FailingPolicy(TransformersPolicy):
        def generate(self, prompts: Any, params: Any) -> Any:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    server = serve(FailingPolicy(policy.model, policy.tokenizer))
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        status, body = exchange(sock, post("/v1/chat/completions", CHAT, server.port))
        error = json.loads(body)["error"]
        assert status == 500 and error["type"] == "server_error" and "RuntimeError" in error["message"]
        status, body = exchange(sock, b"GET /v1/nothing HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 404 and json.loads(body)["error"]["message"].startswith("no such route")
        status, _ = exchange(sock, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 200


# --- exposure: token and adapter directories -------------------------------------------------------


def test_the_token_guards_every_route_but_health(serve: Any) -> None:
    server = serve(token="s3cret")
    assert httpx.get(f"{server.url}/health").status_code == 200
    for answer in (httpx.get(f"{server.url}/v1/models"), httpx.get(f"{server.url}/openapi.json"),
                   httpx.post(f"{server.url}/v1/chat/completions", json=CHAT,
                              headers={"Authorization": "Bearer wrong"})):
        assert answer.status_code == 401 and "--token" in error_of(answer)["message"]
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="s3cret", max_retries=0)
    assert client.chat.completions.create(**CHAT).usage.completion_tokens == 2


def test_adapters_load_only_from_the_allowed_directories(serve: Any, policy: TransformersPolicy,
                                                         tmp_path: Path) -> None:
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    allowed.mkdir()
    good = save_adapter(policy, allowed / "a1")
    elsewhere = save_adapter(policy, outside / "a2")
    (allowed / "link").symlink_to(elsewhere)  # a link inside the allowed directory leads out of it

    off = serve(adapter_dirs=[])
    answer = httpx.post(f"{off.url}/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": str(good)})
    assert answer.status_code == 403 and "--adapter-dir" in error_of(answer)["message"]

    server = serve(adapter_dirs=[allowed])
    for path in (elsewhere, allowed / "link", allowed / ".." / "outside" / "a2", Path("/etc")):
        answer = httpx.post(f"{server.url}/v1/load_lora_adapter",
                            json={"lora_name": "a", "lora_path": str(path)})
        assert answer.status_code == 403 and error_of(answer)["code"] == "adapter_path_not_allowed", path
    relative = httpx.post(f"{server.url}/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "a1"})
    assert relative.status_code == 400 and "absolute" in error_of(relative)["message"]
    loaded = httpx.post(f"{server.url}/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": str(good)})
    assert loaded.status_code == 200
    assert [m["id"] for m in httpx.get(f"{server.url}/v1/models").json()["data"]] == ["tiny", "a"]


def test_adapters_are_capped_and_cannot_take_the_base_models_name(serve: Any, policy: TransformersPolicy,
                                                                  tmp_path: Path) -> None:
    adapter = str(save_adapter(policy, tmp_path / "a1"))
    server = serve(adapter_dirs=[tmp_path], max_adapters=1)

    def load(name: str) -> httpx.Response:
        return httpx.post(f"{server.url}/v1/load_lora_adapter",
                          json={"lora_name": name, "lora_path": adapter})

    assert load("first").status_code == 200
    assert load("first").status_code == 200  # the same name again replaces it
    second = load("second")  # each adapter is a copy of the weights: the cap holds memory in bounds
    assert second.status_code == 400 and "unload one first" in error_of(second)["message"]
    shadowing = load("tiny")
    assert shadowing.status_code == 400 and error_of(shadowing)["param"] == "lora_name"
    assert [m["id"] for m in httpx.get(f"{server.url}/v1/models").json()["data"]] == ["tiny", "first"]


# --- the command ------------------------------------------------------------------------------------


def one_line_error(args: list[str]) -> str:
    result = runner.invoke(app, args, env={"COLUMNS": "250"})
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_serve_policy_refuses_exposure_bad_dtype_and_a_broken_model_in_one_line(tmp_path: Path) -> None:
    small = TinyModelConfig(num_layers=1, hidden_size=32, intermediate_size=64)
    save_tiny(*build_tiny_model(small), tmp_path / "m")
    model = str(tmp_path / "m")
    exposed = one_line_error(["serve-policy", model, "--host", "0.0.0.0", "--port", "0"])
    assert "without --token" in exposed and "--allow-no-token" in exposed
    assert "--dtype 'float8' is not one of float32, bfloat16, float16" in one_line_error(
        ["serve-policy", model, "--dtype", "float8"])
    assert "--adapter-dir" in one_line_error(["serve-policy", model, "--adapter-dir", str(tmp_path / "none")])
    config = (tmp_path / "m" / "config.json").read_text()
    (tmp_path / "m" / "config.json").write_text("{not json")
    message = one_line_error(["serve-policy", model, "--port", str(free_port())])  # and no banner before it
    assert "config.json is not valid JSON" in message
    (tmp_path / "m" / "config.json").write_text(config)
    with open(tmp_path / "m" / "model.safetensors", "r+b") as weights:
        weights.truncate(100)  # a copy cut short
    message = one_line_error(["serve-policy", model, "--port", str(free_port())])
    assert "cannot load the model in" in message and "SafetensorError" in message


# --- a served run, evaluated ----------------------------------------------------------------------------


def test_a_served_run_lends_eval_its_prompt_settings_and_episodes_cut_before_acting_are_reported(
        tmp_path: Path) -> None:
    """runs/quickstart's shape: a 256-token context that only the run's own prompt settings fit."""
    import subprocess
    import sys

    from agentgym.service_kit.launcher import start_service, stop_service

    run = tmp_path / "run"
    save_tiny(*build_tiny_model(TinyModelConfig(num_layers=1, hidden_size=32, intermediate_size=64,
                                                max_position_embeddings=256)), run / "model")
    settings = {"prompt_mode": "current", "include_instructions": False, "show_admissible_actions": False,
                "max_new_tokens": 8}
    (run / "config.json").write_text(json.dumps({"env": {"id": "maze-v0", "kwargs": {"size": 2}},
                                                 "rollout": {**settings, "num_tasks": 8}}))
    (run / "report.json").write_text("{}")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serving = start_service([sys.executable, "-m", "agentgym", "serve-policy", str(run), "--port", str(port),
                             "--device", "cpu"], url, timeout_s=120, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        [entry] = httpx.get(f"{url}/v1/models").json()["data"]
        assert {k: entry["agentgym"]["prompt"][k] for k in settings} == settings
        common = ["--envs", "maze-v0", "--env-arg", "maze-v0:size=2", "--episodes", "2", "--max-turns", "2"]
        served = runner.invoke(app, ["eval", "--policy", f"{url}/v1,name=served", *common,
                                     "--out", str(tmp_path / "served")], env={"COLUMNS": "250"})
        assert served.exit_code == 0, served.output
        [policy] = json.loads((tmp_path / "served" / "plan.json").read_text())["policies"]
        assert {k: policy["prompt"][k] for k in settings} == settings
        assert "before their first action" not in served.output
        records = [json.loads(line) for log in (tmp_path / "served" / "trajectories").rglob("*.jsonl")
                   for line in log.read_text().splitlines()]
        assert len(records) == 2 and all(r["num_turns"] > 0 for r in records)  # the model got to act
        # The user's own settings win; these do not fit the context, and the screen says so.
        cut = runner.invoke(app, ["eval", "--policy", f"{url}/v1,name=served,max_new_tokens=256", *common,
                                  "--out", str(tmp_path / "cut")], env={"COLUMNS": "250"})
        assert cut.exit_code == 0, cut.output
        assert ("maze-v0 × served: 2 of 2 episodes ended before their first action: the prompt outgrew the "
                "model's context") in " ".join(cut.output.split())
    finally:
        stop_service(serving)
