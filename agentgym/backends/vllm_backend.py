"""vLLM generation for training: ``model.backend: vllm`` (in-process, colocated) and ``vllm-server``.

Both keep the trained model in the trainer's process (a ``transformers`` model, with a LoRA adapter
when ``model.lora`` is set) and generate with vLLM; after every update the trainer hands the model to
``sync_weights``. vLLM is imported on first use only, and only these touch it: ``sampling_params``
(request building), ``generation_from_output`` (response parsing), ``VLLMEngine`` (weight loading,
sleep and wake). Everything else is plain Python, tested on CPU with fakes of that thin surface.

**Colocated** (``vllm``): one ``vllm.LLM`` on the training GPU. With ``model.vllm.sleep`` (default)
the engine sleeps while the trainer updates (``offload``: weights to CPU, KV cache freed) and wakes
in two steps around the weight sync: weights first, new weights loaded, then the KV cache, and the
prefix cache is reset (its entries were computed with the old weights).

**Server** (``vllm-server``): generation over the OpenAI-compatible API of a ``vllm serve`` process
(``model.vllm.url``), prompts sent as token ids and generated ids returned as ids (never
re-tokenized). Weight sync, ``model.vllm.weight_sync``:

- ``lora`` (needs ``model.lora``): the adapter is saved under ``model.vllm.adapter_dir`` (a folder the
  server can read) and hot-loaded with ``POST /v1/load_lora_adapter`` (``vllm serve --enable-lora``,
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``); requests then name the new adapter and the previous
  one is unloaded. ``agentgym serve-policy`` speaks the same routes.
- ``full``: the merged weights are written to ``model.vllm.model_dir`` (the folder the server was
  started from) and the server reloads them (``POST /collective_rpc`` ``reload_weights`` and
  ``POST /reset_prefix_cache``: vLLM's development routes, ``VLLM_SERVER_DEV_MODE=1``).

vLLM's log-probs are behaviour log-probs: the trainer recomputes the old log-probs itself, and
``loss.tis_cap`` weights the loss for the gap (``agentgym.training.engine.offpolicy``). Ask vLLM for the
log-probs of the sampling distribution (``logprobs_mode: processed_logprobs``, set here for the
colocated engine; pass ``--logprobs-mode processed_logprobs`` to ``vllm serve``) so they mean what
``Generation.logprobs`` means.

Written against vLLM 0.33 (``SUPPORTED_VLLM``, the ``vllm`` extra's release).
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from agentgym.backends.builder import register_backend, resolve_device
from agentgym.backends.config import ModelConfig
from agentgym.errors import ConfigError
from agentgym.rollout.policy import Generation, PolicyBase, SamplingParams

SUPPORTED_VLLM = "0.33"
"""The vLLM release the backends are written against (the ``vllm`` extra;
``tests/backends/test_vllm_api.py`` checks every vLLM name, keyword and route they use against the installed
release's source)."""


@dataclass(frozen=True)
class VLLMSettings:
    """``model.vllm``: settings of the ``vllm`` and ``vllm-server`` backends.

    Example:
        >>> VLLMSettings.from_dict({"gpu_memory_utilization": 0.3}).gpu_memory_utilization
        0.3
        >>> VLLMSettings.from_dict({"gpu_memory": 0.3})  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        agentgym.errors.ConfigError: model.vllm has no setting 'gpu_memory'
        (did you mean 'gpu_memory_utilization'?)
    """

    gpu_memory_utilization: float = 0.4
    """Colocated: share of the GPU memory vLLM may take (the rest is the trainer's)."""
    sleep: bool = True
    """Colocated: put the engine to sleep while the trainer updates (frees its memory for training)."""
    sleep_level: Literal[1, 2] = 1
    """1: weights offloaded to CPU memory; 2: weights discarded (the sync reloads all of them)."""
    tensor_parallel_size: int = 1
    """Colocated: GPUs one engine spans."""
    max_model_len: int | None = None
    """Longest prompt plus generation vLLM plans for; None: the model's."""
    enforce_eager: bool = False
    """Colocated: no CUDA graphs (faster start, slower decoding)."""
    dtype: str = "bfloat16"
    """Colocated: the engine's dtype (the trained weights are cast to it at every sync)."""
    url: str | None = None
    """Server: the API root of ``vllm serve``, e.g. ``http://10.0.0.5:8000/v1``."""
    served_model: str | None = None
    """Server: the base model's name on the server; None takes the only one it lists."""
    api_key: str | None = None
    """Server: bearer key."""
    weight_sync: Literal["lora", "full", "none"] = "lora"
    """Server: how updates reach the server (module docstring); ``none`` only for evaluation-like runs."""
    adapter_dir: str | None = None
    """Server, ``lora``: where adapters are written for the server to load (shared); None: a temp folder."""
    model_dir: str | None = None
    """Server, ``full``: the folder the server loads its weights from (shared; written at every sync)."""
    concurrency: int = 64
    """Server: requests in flight at once."""
    timeout_s: float = 300.0
    """Server: deadline of one request."""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VLLMSettings:
        """Settings from ``model.vllm``; unknown keys and bad values are ``ConfigError``s naming the key."""
        names = [f.name for f in dataclasses.fields(cls)]
        for key in data:
            if key not in names:
                close = difflib.get_close_matches(key, names, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else f"; settings: {', '.join(names)}"
                raise ConfigError(f"model.vllm has no setting {key!r}{hint}")
        settings = cls(**data)
        if not 0 < settings.gpu_memory_utilization <= 1:
            raise ConfigError("model.vllm.gpu_memory_utilization must be in (0, 1], "
                              f"got {settings.gpu_memory_utilization}")
        if settings.sleep_level not in (1, 2):
            raise ConfigError(f"model.vllm.sleep_level must be 1 or 2, got {settings.sleep_level!r}")
        if settings.weight_sync not in ("lora", "full", "none"):
            raise ConfigError("model.vllm.weight_sync must be lora, full or none, "
                              f"got {settings.weight_sync!r}")
        return settings


def _vllm() -> Any:
    """The vllm module, once the names the backend calls resolve: vLLM re-exports them lazily, so a vLLM
    that imports may still fail to load them (installed without its requirements, as ``make setup`` does
    for the API test, or built for another torch)."""
    try:
        import vllm

        for name in ("LLM", "SamplingParams", "TokensPrompt"):
            getattr(vllm, name)
    except Exception as exc:  # ImportError, or whatever a build for another torch/CUDA raises as it loads
        raise ConfigError(f"model.backend vllm needs a working vLLM {SUPPORTED_VLLM} (a CUDA machine; here "
                          f"{type(exc).__name__}: {exc}): pip install 'agentgym-rl[vllm]'; or use "
                          "model.backend=vllm-server against a `vllm serve` elsewhere") from exc
    return vllm


# --- the thin vLLM surface: request building, response parsing --------------------------------------


def sampling_params(vllm: Any, params: SamplingParams, *, seed: int | None = None) -> Any:
    """``vllm.SamplingParams`` for one prompt of a batch, asking for the sampled tokens' log-probs."""
    return vllm.SamplingParams(
        n=1, max_tokens=params.max_new_tokens, temperature=params.temperature, top_p=params.top_p,
        top_k=max(params.top_k, 0), stop=list(params.stop_strings) or None,
        include_stop_str_in_output=True, seed=seed, logprobs=params.num_top_logprobs,
        detokenize=bool(params.stop_strings))


def generation_from_output(output: Any, params: SamplingParams) -> Generation:
    """A ``Generation`` from one ``vllm.RequestOutput`` (its first completion).

    vLLM returns, per position, a dict ``token_id -> Logprob(logprob, rank, decoded_token)`` holding
    the sampled id and the ``logprobs`` most likely ones.

    Raises:
        ConfigError: the output lacks the sampled token's log-prob (vLLM asked without ``logprobs``).
    """
    completion = output.outputs[0]
    ids = [int(t) for t in completion.token_ids]
    positions = completion.logprobs or []
    if len(positions) != len(ids):
        raise ConfigError(f"vLLM returned {len(positions)} log-prob entries for {len(ids)} tokens; "
                          "sampling_params must ask for logprobs")
    logprobs = [float(entry[token].logprob) for token, entry in zip(ids, positions, strict=True)]
    top = None
    if params.num_top_logprobs:
        top = [sorted(((int(t), float(lp.logprob)) for t, lp in entry.items() if lp.rank is not None
                       and lp.rank <= params.num_top_logprobs), key=lambda pair: -pair[1])
               for entry in positions]
    reason = "length" if completion.finish_reason == "length" else "stop"
    return Generation(ids, logprobs, reason, top, None, {"engine": "vllm"})


class VLLMEngine:
    """The calls agentgym makes on a ``vllm.LLM``; replace it to run without vLLM (tests do).

    ``load_weights`` reaches the model inside the engine: with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``
    (set before vLLM is imported here) the engine core runs in this process and its worker's model
    runner holds the model, whose ``load_weights`` takes (name, tensor) pairs with Hugging Face names.
    """

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    def generate(self, prompts: list[Any], params: list[Any]) -> list[Any]:
        return self.llm.generate(prompts, params, use_tqdm=False)

    def sleep(self, level: int) -> None:
        self.llm.sleep(level=level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.llm.wake_up(tags=tags)

    def reset_prefix_cache(self) -> None:
        self.llm.reset_prefix_cache()

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        executor = self.llm.llm_engine.model_executor
        worker = getattr(executor, "driver_worker", None)
        worker = getattr(worker, "worker", worker)
        runner = getattr(worker, "model_runner", None)
        if runner is None:
            raise ConfigError("this vLLM version does not expose its model to the process that created it; "
                              "use a vLLM version in the vllm extra's range, or model.backend=vllm-server")
        runner.model.load_weights(weights)


def weights_to_sync(model: Any) -> Iterable[tuple[str, Any]]:
    """(Hugging Face name, tensor) of the trained policy: its weights, or the base with a LoRA adapter
    merged."""
    from agentgym.backends.lora import is_lora, merged_state_dict

    if is_lora(model):
        return merged_state_dict(model).items()
    return ((name, tensor.detach()) for name, tensor in model.state_dict().items())


# --- the colocated policy -----------------------------------------------------------------------------


class VLLMPolicy(PolicyBase):
    """``Policy`` over an in-process vLLM engine next to the trained model (module docstring).

    Args:
        trainer: the ``TransformersPolicy`` of the trained model (``score`` and ``model`` are its).
        engine: the engine (``VLLMEngine`` or anything with its methods).
        vllm: the vllm module (or a stand-in with ``SamplingParams`` and ``TokensPrompt``).
        settings: sleep settings.
        seed: sampling seed of unseeded batches.
    """

    supports_entropies = False
    """vLLM returns no per-position entropies (algorithms that need them refuse this backend)."""
    max_top_logprobs = 20
    """vLLM's default cap on ``logprobs`` (``--max-logprobs``)."""

    @property
    def pauses_for_updates(self) -> bool:  # type: ignore[override]
        """The engine sleeps during updates when ``settings.sleep`` (``offload``)."""
        return bool(self.settings.sleep)

    def __init__(self, trainer: Any, engine: Any, vllm: Any, settings: VLLMSettings, *,
                 seed: int = 0) -> None:
        self.trainer = trainer
        self.model = trainer.model
        self.tokenizer = trainer.tokenizer
        self.engine = engine
        self.vllm = vllm
        self.settings = settings
        self.asleep = False
        self.syncs = 0
        self._seeds = itertools.count(seed * 1_000_003)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """One vLLM request per prompt (``seed + i`` for prompt i when seeded), in one engine call."""
        if not prompts:
            return []
        self.wake()
        base = params.seed if params.seed is not None else next(self._seeds)
        requests = [self.vllm.TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        per_prompt = [sampling_params(self.vllm, params, seed=base + i) for i in range(len(prompts))]
        return [generation_from_output(out, params) for out in self.engine.generate(requests, per_prompt)]

    def score(self, *args: Any, **kwargs: Any) -> list[list[float]]:
        """Teacher-forced log-probs, by the trained model itself (``TransformersPolicy.score``)."""
        return self.trainer.score(*args, **kwargs)

    def offload(self) -> None:
        """The trainer is about to update: put the engine to sleep (when ``settings.sleep``)."""
        if self.settings.sleep and not self.asleep:
            self.engine.sleep(self.settings.sleep_level)
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            self.engine.wake_up(None)
            self.asleep = False

    def sync_weights(self, state_dict: Any) -> None:
        """Load the trained weights into the engine (a model or a state dict; None: nothing to do)."""
        if state_dict is None:
            return
        weights = weights_to_sync(state_dict) if hasattr(state_dict, "state_dict") else state_dict.items()
        if self.asleep:  # weights back on the GPU first, the KV cache only once they are loaded
            self.engine.wake_up(["weights"])
            self.engine.load_weights(weights)
            self.engine.wake_up(["kv_cache"])
            self.asleep = False
        else:
            self.engine.load_weights(weights)
        self.engine.reset_prefix_cache()
        self.syncs += 1


def _trainer_policy(cfg: ModelConfig, seed: int) -> Any:
    from agentgym.backends.builder import make_policy

    return make_policy(dataclasses.replace(cfg, backend="transformers", vllm={}), seed=seed)


def _model_dir(cfg: ModelConfig, trainer: Any) -> str:
    """The HF directory vLLM loads: ``model.path`` (a packaged model or a .gguf file converted once), or the
    tiny model saved to a temporary folder."""
    if cfg.path:
        from agentgym.backends.gguf import model_dir

        return str(model_dir(cfg.path, revision=cfg.revision))
    folder = tempfile.mkdtemp(prefix="agentgym-vllm-model-")
    from agentgym.backends.lora import is_lora, merged_state_dict

    model = trainer.model
    if is_lora(model):
        model.get_base_model().save_pretrained(folder, state_dict=merged_state_dict(model))
    else:
        model.save_pretrained(folder)
    trainer.tokenizer.save_pretrained(folder)
    return folder


def _vllm_colocated(cfg: ModelConfig, seed: int) -> Any:
    settings = VLLMSettings.from_dict(dict(cfg.vllm))
    resolve_device(cfg.device)  # the trainer's device; vLLM picks its own (CUDA, or a CPU build)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine's model in this process (sync)
    vllm = _vllm()
    trainer = _trainer_policy(cfg, seed)
    extra: dict[str, Any] = {}
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # One engine per training process (data parallel): vLLM must not start processes of its own.
        extra["distributed_executor_backend"] = "external_launcher"
    llm = vllm.LLM(model=_model_dir(cfg, trainer), dtype=settings.dtype, seed=seed, **extra,
                   gpu_memory_utilization=settings.gpu_memory_utilization, enable_sleep_mode=settings.sleep,
                   tensor_parallel_size=settings.tensor_parallel_size, max_model_len=settings.max_model_len,
                   enforce_eager=settings.enforce_eager, logprobs_mode="processed_logprobs")
    return VLLMPolicy(trainer, VLLMEngine(llm), vllm, settings, seed=seed)


register_backend("vllm", _vllm_colocated)
