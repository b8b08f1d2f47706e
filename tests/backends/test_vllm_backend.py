"""The vLLM backends without vLLM: request building, response parsing, sleep/wake sequencing and weight
sync of the colocated engine against a stand-in of the thin vLLM surface it calls (an engine that really
generates, with a tiny model of its own), and the server mode trained against ``agentgym serve-policy``
(which speaks vLLM's LoRA-loading routes). The real engine: ``-m gpu`` tests at the end."""

from __future__ import annotations

import dataclasses
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import httpx
import numpy as np
import pytest
import torch
from conftest import LiveServer
from learning import small

from agentgym.backends.builder import make_policy
from agentgym.backends.config import LoraConfig, ModelConfig, TinyModelConfig
from agentgym.backends.openai_server import create_policy_app
from agentgym.backends.tiny import load_model_and_tokenizer
from agentgym.backends.transformers_backend import TransformersPolicy
from agentgym.backends.vllm_backend import VLLMSettings, _vllm, generation_from_output, sampling_params
from agentgym.errors import ConfigError
from agentgym.rollout.policy import SamplingParams
from agentgym.training.config.loading import load_config
from agentgym.training.run.loop import train

SMALL = small("iterations=2", "eval.num_episodes=2", "sft.enabled=false", "env.max_turns=3",
              "model.device=cpu")


# --- a stand-in for the vllm module: SamplingParams, TokensPrompt, LLM ---------------------------------


@dataclasses.dataclass
class FakeSamplingParams:
    n: int = 1
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: list[str] | None = None
    include_stop_str_in_output: bool = False
    seed: int | None = None
    logprobs: int | None = None
    detokenize: bool = True


@dataclasses.dataclass
class Logprob:
    logprob: float
    rank: int | None
    decoded_token: str | None = None


class FakeModel:
    """vLLM's model object: ``load_weights`` takes (HF name, tensor) pairs."""

    def __init__(self, hf_model: torch.nn.Module) -> None:
        self.hf = hf_model

    def load_weights(self, weights: Any) -> None:
        state = dict(weights)
        missing = set(state) - set(self.hf.state_dict())
        assert not missing, f"names vLLM would not know: {sorted(missing)[:3]}"
        self.hf.load_state_dict(state, strict=False)
        FakeLLM.calls.append(("load_weights", len(state)))


class FakeLLM:
    """``vllm.LLM`` reduced to what agentgym calls; generates with its own copy of the model."""

    calls: ClassVar[list[tuple[Any, ...]]] = []
    instances: ClassVar[list[FakeLLM]] = []

    def __init__(self, model: str, **kwargs: Any) -> None:
        self.kwargs = kwargs
        hf, tokenizer = load_model_and_tokenizer(model)
        self.policy = TransformersPolicy(hf, tokenizer, seed=0)
        runner = types.SimpleNamespace(model=FakeModel(hf))
        self.llm_engine = types.SimpleNamespace(model_executor=types.SimpleNamespace(
            driver_worker=types.SimpleNamespace(model_runner=runner)))
        self.awake = {"weights", "kv_cache"}
        FakeLLM.instances.append(self)

    def generate(self, prompts: list[dict], params: list[FakeSamplingParams],
                 use_tqdm: bool = False) -> list[Any]:
        assert self.awake == {"weights", "kv_cache"}, f"generate while asleep ({self.awake})"
        FakeLLM.calls.append(("generate", len(prompts)))
        outputs = []
        for prompt, p in zip(prompts, params, strict=True):
            ours = SamplingParams(max_new_tokens=p.max_tokens, temperature=p.temperature, top_p=p.top_p,
                                  top_k=max(p.top_k, 0), stop_strings=tuple(p.stop or ()), seed=p.seed,
                                  num_top_logprobs=max(p.logprobs or 0, 1))
            [g] = self.policy.generate([prompt["prompt_token_ids"]], ours)
            entries = []
            for token, lp, top in zip(g.token_ids, g.logprobs, g.top_logprobs, strict=True):
                entry = {t: Logprob(v, rank + 1) for rank, (t, v) in enumerate(top[: p.logprobs or 0])}
                entry.setdefault(token, Logprob(lp, 99))
                entries.append(entry)
            outputs.append(types.SimpleNamespace(outputs=[types.SimpleNamespace(
                token_ids=g.token_ids, logprobs=entries, finish_reason=g.finish_reason)]))
        return outputs

    def sleep(self, level: int = 1) -> None:
        FakeLLM.calls.append(("sleep", level))
        self.awake = set()

    def wake_up(self, tags: list[str] | None = None) -> None:
        FakeLLM.calls.append(("wake_up", tuple(tags) if tags else None))
        self.awake |= set(tags or ("weights", "kv_cache"))

    def reset_prefix_cache(self) -> None:
        FakeLLM.calls.append(("reset_prefix_cache",))


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    module = types.ModuleType("vllm")
    module.LLM = FakeLLM  # type: ignore[attr-defined]
    module.SamplingParams = FakeSamplingParams  # type: ignore[attr-defined]
    module.TokensPrompt = dict  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", module)
    FakeLLM.calls, FakeLLM.instances = [], []
    yield module


# --- request building and response parsing --------------------------------------------------------------



def _update_and_sync(policy) -> None:
    """Stand-in for an optimiser step on the trained weights, then the sync the trainer makes."""
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    policy.offload()
    policy.sync_weights(policy.model)

def test_sampling_params_ask_for_what_a_generation_needs(fake_vllm: types.ModuleType) -> None:
    built = sampling_params(fake_vllm, SamplingParams(max_new_tokens=7, temperature=0.7, top_p=0.9, top_k=0,
                                                      stop_strings=("</a>",), num_top_logprobs=3), seed=11)
    assert ((built.max_tokens, built.temperature, built.top_p, built.top_k, built.seed)
            == (7, 0.7, 0.9, 0, 11))  # top_k 0: every token (vLLM's default)
    assert built.stop == ["</a>"] and built.include_stop_str_in_output and built.logprobs == 3
    plain = sampling_params(fake_vllm, SamplingParams(top_k=5))
    assert plain.stop is None and plain.top_k == 5 and plain.logprobs == 0 and not plain.detokenize


def test_generation_from_a_vllm_output() -> None:
    output = types.SimpleNamespace(outputs=[types.SimpleNamespace(
        token_ids=[5, 9], finish_reason="length",
        logprobs=[{5: Logprob(-0.1, 1), 7: Logprob(-2.5, 2)}, {3: Logprob(-0.3, 1), 9: Logprob(-1.7, 4)}])])
    g = generation_from_output(output, SamplingParams(num_top_logprobs=1))
    assert g.token_ids == [5, 9] and g.logprobs == [-0.1, -1.7] and g.finish_reason == "length"
    assert g.top_logprobs == [[(5, -0.1)], [(3, -0.3)]]
    broken = types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=[5], finish_reason="stop",
                                                                  logprobs=None)])
    with pytest.raises(ConfigError, match="must ask for logprobs"):
        generation_from_output(broken, SamplingParams())


def test_a_vllm_that_imports_but_cannot_load_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM re-exports lazily: installed without its requirements (``make setup``) it imports, and fails
    only when ``vllm.LLM`` loads. The backend says so in one line instead of failing later."""
    module = types.ModuleType("vllm")

    def missing(name: str) -> Any:
        raise ModuleNotFoundError("No module named 'cbor2'")

    module.__getattr__ = missing  # type: ignore[method-assign]
    monkeypatch.setitem(sys.modules, "vllm", module)
    with pytest.raises(ConfigError, match=r"needs a working vLLM 0\.33 .*ModuleNotFoundError: .*'cbor2'"):
        _vllm()
    with pytest.raises(ConfigError, match="cbor2"):
        make_policy(ModelConfig(tiny=TinyModelConfig(num_layers=1), device="cpu", backend="vllm"))


def test_settings_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"model.vllm.weight_sync must be lora, full or none"):
        VLLMSettings.from_dict({"weight_sync": "nccl"})


# --- the colocated engine ----------------------------------------------------------------------------


def test_colocated_generation_matches_the_trained_model_and_sleeps_around_updates(
    fake_vllm: types.ModuleType,
) -> None:
    cfg = ModelConfig(tiny=TinyModelConfig(num_layers=1), device="cpu", backend="vllm")
    policy = make_policy(cfg, seed=4)
    prompt = policy.tokenizer.encode("go north", add_special_tokens=False)
    params = SamplingParams(max_new_tokens=6, temperature=0)
    [ours] = policy.generate([prompt], params)
    [direct] = policy.trainer.generate([prompt], params)
    assert ours.token_ids == direct.token_ids and np.allclose(ours.logprobs, direct.logprobs, atol=1e-5)
    # An update changes the trained weights; the engine sees them only after the sync.
    _update_and_sync(policy)
    [after] = policy.generate([prompt], params)
    [direct_after] = policy.trainer.generate([prompt], params)
    assert np.allclose(after.logprobs, direct_after.logprobs, atol=1e-5)
    assert [c[0] for c in FakeLLM.calls] == ["generate", "sleep", "wake_up", "load_weights", "wake_up",
                                             "reset_prefix_cache", "generate"]
    assert FakeLLM.calls[2] == ("wake_up", ("weights",)) and FakeLLM.calls[4] == ("wake_up", ("kv_cache",))


def test_colocated_without_sleep_and_waking_for_generation(fake_vllm: types.ModuleType) -> None:
    cfg = ModelConfig(tiny=TinyModelConfig(num_layers=1), device="cpu", backend="vllm", vllm={"sleep": False})
    policy = make_policy(cfg, seed=0)
    policy.offload()
    policy.sync_weights(policy.model)
    assert [c[0] for c in FakeLLM.calls] == ["load_weights", "reset_prefix_cache"]
    FakeLLM.calls.clear()
    awake = make_policy(dataclasses.replace(cfg, vllm={}), seed=0)
    awake.offload()
    awake.generate([[104, 105]], SamplingParams(max_new_tokens=2))  # asleep: woken before generating
    assert FakeLLM.calls[:2] == [("sleep", 1), ("wake_up", None)]


def test_training_with_the_colocated_engine_syncs_merged_lora_weights(fake_vllm: types.ModuleType,
                                                                      tmp_path: Path) -> None:
    cfg = load_config(None, [*SMALL, "model.backend=vllm", "model.lora.r=4", "optim.lr=0.01",
                             "loss.tis_cap=2.0"])
    report = train(cfg, tmp_path)
    assert len(report["history"]) == 2
    assert "offpolicy/is_weight_mean" in report["history"][0]
    engine = FakeLLM.instances[-1]
    kinds = [c[0] for c in FakeLLM.calls]
    assert kinds.count("sleep") == 2 and kinds.count("load_weights") == 2
    assert kinds.index("sleep") < kinds.index("load_weights")
    # The engine's weights are the trained base with the adapter merged in.
    merged, _ = load_model_and_tokenizer(str(tmp_path / "model"))
    ours = engine.llm_engine.model_executor.driver_worker.model_runner.model.hf.state_dict()
    assert all(torch.allclose(ours[k], v, atol=1e-6) for k, v in merged.state_dict().items())
    start = load_model_and_tokenizer(dataclasses.replace(cfg.model.tiny, seed=cfg.seed))[0].state_dict()
    assert any(not torch.allclose(v, start[k]) for k, v in merged.state_dict().items()), (
        "training changed nothing")


# --- the server mode, against agentgym serve-policy --------------------------------------------------


@pytest.fixture
def base_server(tmp_path: Path) -> Iterator[LiveServer]:
    """serve-policy serving the tiny model a run with seed 0 starts from."""
    cfg = load_config(None, SMALL)
    policy = TransformersPolicy.from_pretrained(dataclasses.replace(cfg.model.tiny, seed=cfg.seed), seed=0)
    live = LiveServer(create_policy_app(policy, "base", max_new_tokens=64))
    yield live
    live.stop()


def test_server_mode_trains_and_hot_loads_the_adapter(base_server: LiveServer, tmp_path: Path) -> None:
    url = f"{base_server.url}/v1"
    overrides = [*SMALL, "model.backend=vllm-server", "model.lora.r=4", "optim.lr=0.01",
                 f"model.vllm={{url: '{url}', adapter_dir: '{tmp_path / 'adapters'}'}}"]
    report = train(load_config(None, overrides), tmp_path / "run")
    assert len(report["history"]) == 2
    served = [m["id"] for m in httpx.get(f"{url}/models").json()["data"]]
    # One adapter before the newest stays loaded (requests sent before a sync may still run on it); the
    # one before that is unloaded and deleted at the next sync.
    assert served == ["base", "agentgym-step1", "agentgym-step2"]
    assert sorted(p.name for p in (tmp_path / "adapters").iterdir()) == ["agentgym-step1", "agentgym-step2"]
    # The served adapter computes what the trained policy computes.
    trained, tokenizer = load_model_and_tokenizer(str(tmp_path / "run" / "model"))
    prompt = tokenizer.encode("find the exit", add_special_tokens=False)
    body = {"model": "agentgym-step2", "prompt": prompt, "max_tokens": 5, "temperature": 0, "logprobs": 1,
            "return_token_ids": True}
    remote = httpx.post(f"{url}/completions", json=body).json()["choices"][0]
    greedy = SamplingParams(max_new_tokens=5, temperature=0)
    [local] = TransformersPolicy(trained, tokenizer).generate([prompt], greedy)
    assert remote["token_ids"] == local.token_ids
    assert np.allclose(remote["logprobs"]["token_logprobs"], local.logprobs, atol=1e-4)


def test_server_mode_errors_say_what_to_set(base_server: LiveServer) -> None:
    url = f"{base_server.url}/v1"
    with pytest.raises(ConfigError, match="needs model.vllm.url"):
        make_policy(ModelConfig(backend="vllm-server", device="cpu"))
    with pytest.raises(ConfigError, match="set model.lora"):
        make_policy(ModelConfig(backend="vllm-server", device="cpu", vllm={"url": url}))
    with pytest.raises(ConfigError, match="has no setting 'adapters'"):
        make_policy(ModelConfig(backend="vllm-server", device="cpu", vllm={"url": url, "adapters": "x"}))


def test_serve_policy_refuses_an_adapter_for_another_model(base_server: LiveServer, tmp_path: Path) -> None:
    other = make_policy(ModelConfig(tiny=TinyModelConfig(hidden_size=32, num_heads=2, num_kv_heads=1),
                                    device="cpu", lora=LoraConfig(r=2)), seed=0)
    other.model.save_pretrained(tmp_path / "wrong")
    answer = httpx.post(f"{base_server.url}/v1/load_lora_adapter",
                        json={"lora_name": "x", "lora_path": str(tmp_path / "wrong")})
    assert answer.status_code == 400 and "does not fit" in answer.json()["error"]["message"]
    missing = httpx.post(f"{base_server.url}/v1/unload_lora_adapter", json={"lora_name": "nope"})
    assert missing.status_code == 404


# --- the real engine (CUDA machine with vLLM) ---------------------------------------------------------


@pytest.mark.gpu
def test_real_vllm_engine_generates_and_syncs(tmp_path: Path) -> None:
    try:  # importable is not enough: make setup installs vLLM's source alone, without its requirements
        _vllm()
    except ConfigError as exc:
        pytest.skip(f"the vllm extra is not installed: {exc}")
    cfg = ModelConfig(tiny=TinyModelConfig(hidden_size=256, num_heads=4, num_kv_heads=2), device="cuda",
                      backend="vllm", dtype="bfloat16",
                      vllm={"gpu_memory_utilization": 0.2, "enforce_eager": True})
    policy = make_policy(cfg, seed=0)
    prompt = policy.tokenizer.encode("hello", add_special_tokens=False)
    params = SamplingParams(max_new_tokens=8, temperature=0)
    [before] = policy.generate([prompt], params)
    _update_and_sync(policy)
    [after] = policy.generate([prompt], params)
    [direct] = policy.trainer.generate([prompt], params)
    assert len(before.token_ids) == 8 and after.token_ids[:2] == direct.token_ids[:2]


def test_server_mode_asynchronous_run_loads_adapters_while_generating(base_server: LiveServer,
                                                                      tmp_path: Path) -> None:
    """max_staleness 2: the trainer's thread loads each update's adapter while the rollout thread's requests
    are in flight; every turn names the version that sampled it, within 2 updates of its use."""
    url = f"{base_server.url}/v1"
    overrides = [*SMALL, "iterations=4", "model.backend=vllm-server", "model.lora.r=4", "optim.lr=0.01",
                 "rollout.max_staleness=2", f"model.vllm={{url: '{url}', adapter_dir: '{tmp_path / 'a'}'}}"]
    report = train(load_config(None, overrides), tmp_path / "run")
    history = report["history"]
    assert [m["iteration"] for m in history] == [1, 2, 3, 4]
    for m in history:
        assert 0 <= m["rollout/staleness"] <= 2
    assert history[0]["rollout/staleness"] == 0
    served = [m["id"] for m in httpx.get(f"{url}/models").json()["data"]]
    # one load per update and one before the final evaluation; the newest two stay loaded
    assert served == ["base", "agentgym-step4", "agentgym-step5"]


def test_only_the_writing_process_sends_the_adapter(base_server: LiveServer, tmp_path: Path) -> None:
    url = f"{base_server.url}/v1"
    cfg = load_config(None, SMALL)
    model_cfg = dataclasses.replace(cfg.model, backend="vllm-server", lora=LoraConfig(r=2),
                                    vllm={"url": url, "adapter_dir": str(tmp_path)})
    other = make_policy(model_cfg, seed=cfg.seed)
    other.writer = False  # another training process: the main one loads the adapter
    other.sync_weights(other.model)
    assert other.endpoint.model == "agentgym-step1" and not list(tmp_path.iterdir())
    assert [m["id"] for m in httpx.get(f"{url}/models").json()["data"]] == ["base"]
    main = make_policy(model_cfg, seed=cfg.seed)
    main.sync_weights(main.model)
    assert [m["id"] for m in httpx.get(f"{url}/models").json()["data"]] == ["base", "agentgym-step1"]
    [reply] = other.generate([[104, 105]], SamplingParams(max_new_tokens=3, temperature=0))
    assert len(reply.token_ids) == 3  # served by the adapter the main process loaded
    main.sync_weights(main.model)
    main.sync_weights(main.model)  # the third sync retires the first adapter: two stay loaded
    assert [m["id"] for m in httpx.get(f"{url}/models").json()["data"]] == ["base", "agentgym-step2",
                                                                            "agentgym-step3"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agentgym-step2", "agentgym-step3"]
    other.close()
    main.close()
