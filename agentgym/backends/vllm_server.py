"""``model.backend: vllm-server``: training with generation on a ``vllm serve`` process over HTTP.

See ``agentgym.backends.vllm_backend`` for the whole picture. Generation is ``OpenAIPolicy`` (token-id
prompts, generated ids and log-probs returned, never re-tokenized); this module adds the weight sync:
LoRA adapter hot-loading (``/v1/load_lora_adapter``) or a full reload from a shared folder.
``agentgym serve-policy`` serves the LoRA routes too, so this backend trains against it on a CPU.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path
from typing import Any

import httpx

from agentgym.backends.builder import register_backend
from agentgym.backends.config import ModelConfig
from agentgym.backends.openai_backend import OpenAIEndpoint, OpenAIPolicy, PolicyEndpointError
from agentgym.backends.vllm_backend import VLLMSettings
from agentgym.errors import ConfigError
from agentgym.rollout.policy import Generation, PolicyBase, SamplingParams


class VLLMServerPolicy(PolicyBase):
    """``Policy`` generating on an OpenAI-compatible vLLM server, with the trained model in this process.

    Args:
        trainer: the ``TransformersPolicy`` of the trained model (``model``, ``tokenizer``, ``score``).
        endpoint: the server and its base model.
        settings: weight-sync mode and folders.

    ``sync_weights(model)`` sends the model's new weights (module docstring) and from then on asks for
    the new adapter by name; ``requests`` counts the sync calls made (``syncs``).
    """

    supports_entropies = False
    """Entropies are not available over the OpenAI API."""
    shared_by_processes = True
    """Every training process generates on the one server; the main process sends the weights."""
    takes_weights_in_flight = True
    """The server loads an update's weights while requests are in flight (asynchronous rollouts): requests
    made after the load use them, and the adapter in use before it stays loaded until the next sync, so
    requests still running finish on it."""

    def __init__(self, trainer: Any, endpoint: OpenAIEndpoint, settings: VLLMSettings) -> None:
        self.trainer = trainer
        self.model = trainer.model
        self.tokenizer = trainer.tokenizer
        self.endpoint = endpoint
        self.settings = settings
        self.base_model = endpoint.model
        self.adapter: str | None = None
        """Name of the adapter requests use (None: the base model)."""
        self.previous_adapter: str | None = None
        """The adapter before it, kept loaded until the next sync."""
        self.syncs = 0
        self.writer = True
        """Whether this process sends the weights; under several training processes only the main one
        does, and the others switch to the adapter name it loads (names are numbered, so they agree)."""
        self._owned_dir: str | None = None
        self.generator = OpenAIPolicy(endpoint, trainer.tokenizer, concurrency=settings.concurrency)
        self.http = httpx.Client(base_url=_server_root(endpoint.base_url), timeout=settings.timeout_s,
                                 headers=({"Authorization": f"Bearer {settings.api_key}"} if settings.api_key
                                          else {}))

    def generate(self, prompts: Any, params: SamplingParams) -> list[Generation]:
        return self.generator.generate(prompts, params)

    def score(self, *args: Any, **kwargs: Any) -> list[list[float]]:
        """Teacher-forced log-probs, by the trained model itself."""
        return self.trainer.score(*args, **kwargs)

    def sync_weights(self, state_dict: Any) -> None:
        """Send the trained model's weights to the server (``weight_sync``); None: nothing to send."""
        if state_dict is None or self.settings.weight_sync == "none":
            return
        if not hasattr(state_dict, "state_dict"):
            raise ConfigError("vllm-server syncs from the trained model itself; "
                              "pass the model, not a state dict")
        self.syncs += 1
        if self.settings.weight_sync == "lora":
            self._sync_adapter(state_dict)
        else:
            self._sync_full(state_dict)

    def _sync_adapter(self, model: Any) -> None:
        folder = Path(self.settings.adapter_dir or self._temp_dir())
        name = f"agentgym-step{self.syncs}"
        # The adapter two syncs old goes: requests sent before the last sync may still be running on the
        # previous one (asynchronous rollouts generate while weights are synced).
        retired, self.previous_adapter = self.previous_adapter, self.adapter
        if not self.writer:
            self.adapter = name
            self.endpoint.use_model(name)  # requests now name the adapter
            return
        model.save_pretrained(folder / name)
        self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str((folder / name).resolve())})
        self.adapter = name
        self.endpoint.use_model(name)  # loaded: requests now name the adapter
        if retired is not None:
            self._post("/v1/unload_lora_adapter", {"lora_name": retired})
            shutil.rmtree(folder / retired, ignore_errors=True)

    def _sync_full(self, model: Any) -> None:
        from agentgym.backends.lora import is_lora, merged_state_dict

        if not self.writer:
            return

        if not self.settings.model_dir:
            raise ConfigError("model.vllm.weight_sync=full needs model.vllm.model_dir: the folder "
                              "`vllm serve` was started from, writable here")
        target = Path(self.settings.model_dir)
        if is_lora(model):
            model.get_base_model().save_pretrained(target, state_dict=merged_state_dict(model))
        else:
            model.save_pretrained(target)
        self._post("/collective_rpc", {"method": "reload_weights"})
        self._post("/reset_prefix_cache", None)

    def _post(self, route: str, body: dict[str, Any] | None) -> None:
        where = f"vLLM server {self.http.base_url}{route}"
        try:
            response = self.http.post(route, json=body) if body is not None else self.http.post(route)
        except httpx.HTTPError as exc:
            raise PolicyEndpointError(f"{where} is unreachable ({type(exc).__name__}: {exc})") from None
        if response.status_code >= 400:
            hint = {404: "; the server lacks this route: start vllm serve with --enable-lora and "
                         "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (lora), or VLLM_SERVER_DEV_MODE=1 (full)"}
            raise PolicyEndpointError(f"{where} answered HTTP {response.status_code}: {response.text[:300]}"
                                      f"{hint.get(response.status_code, '')}")

    def _temp_dir(self) -> str:
        if self._owned_dir is None:
            self._owned_dir = tempfile.mkdtemp(prefix="agentgym-adapters-")
        return self._owned_dir

    def close(self) -> None:
        self.generator.close()
        self.http.close()
        if self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)


def _server_root(base_url: str) -> str:
    """``http://host:port`` of an API root such as ``http://host:port/v1``."""
    return base_url.removesuffix("/v1")


def _vllm_server(cfg: ModelConfig, seed: int) -> Any:
    from agentgym.backends.builder import make_policy

    settings = VLLMSettings.from_dict(dict(cfg.vllm))
    if not settings.url:
        raise ConfigError("model.backend vllm-server needs model.vllm.url, the server's API root "
                          "(e.g. http://10.0.0.5:8000/v1)")
    if settings.weight_sync == "lora" and cfg.lora is None:
        raise ConfigError("model.vllm.weight_sync=lora syncs a LoRA adapter: set model.lora "
                          "(e.g. model.lora.r=16), or use model.vllm.weight_sync=full")
    endpoint = OpenAIEndpoint(settings.url, settings.served_model, api_key=settings.api_key,
                              timeout_s=settings.timeout_s)
    endpoint.check()
    trainer = make_policy(dataclasses.replace(cfg, backend="transformers", vllm={}), seed=seed)
    return VLLMServerPolicy(trainer, endpoint, settings)


register_backend("vllm-server", _vllm_server)
