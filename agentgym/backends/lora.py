"""LoRA adapters through PEFT: wrap a model, use it with the adapter off (the KL reference), save and merge.

A LoRA run keeps one copy of the base weights, frozen. The policy is the base plus the adapter;
the reference policy of the KL term is the *same* module with the adapter disabled
(``AdapterDisabled``), so no second copy of the weights exists. Checkpoints hold only the adapter
(``adapter_state_dict``); ``merged_state_dict`` gives plain base-model weights with the adapter
folded in (computed beside the model, which is left untouched), which is what ``model/`` of a run
folder holds so that any tool loads it as an ordinary Hugging Face model.

An SFT warm start trains the adapter too; ``merge_into_base`` then folds it into the base weights
(in place) and restarts the adapter at zero, so the reference (adapter off) is the post-SFT policy, as
in a full run.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from agentgym.backends.config import LoraConfig
from agentgym.errors import ConfigError

#: The adapter's name inside PEFT models built here.
ADAPTER = "default"


def _peft() -> Any:
    try:
        import peft
    except ImportError:
        raise ConfigError("model.lora needs the peft package: pip install 'agentgym-rl[lora]'") from None
    return peft


@contextlib.contextmanager
def _peft_reads_a_deprecated_property() -> Iterator[None]:
    """PEFT's model wrapper reads ``is_gradient_checkpointing``, which transformers 5 deprecated in favour of
    ``is_activation_checkpointing``: a FutureWarning on every adapter made or loaded that the user can do
    nothing about. Only that warning is silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated",
                                category=FutureWarning)
        yield


def apply_lora(model: torch.nn.Module, cfg: LoraConfig) -> torch.nn.Module:
    """``model`` wrapped with a fresh LoRA adapter (``peft.PeftModelForCausalLM``); only the adapter trains.

    Raises:
        ConfigError: peft is missing, or no layer of the model matches ``target_modules``.

    Example:
        >>> from agentgym.backends.tiny import build_tiny_model
        >>> from agentgym.backends.config import TinyModelConfig
        >>> model = apply_lora(build_tiny_model(TinyModelConfig(num_layers=1))[0], LoraConfig(r=2))
        >>> is_lora(model), sorted({n.split(".")[-2] for n, p in model.named_parameters() if p.requires_grad})
        (True, ['default'])
    """
    peft = _peft()
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [m for m in cfg.target_modules if m not in names]
    if len(missing) == len(cfg.target_modules):
        raise ConfigError(f"model.lora.target_modules {list(cfg.target_modules)} match no layer of this "
                          "model; its linear layers are named e.g. "
                          f"{sorted(n for n in names if 'proj' in n)[:8]}")
    config = peft.LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                             target_modules=[m for m in cfg.target_modules if m in names],
                             task_type="CAUSAL_LM")
    with _peft_reads_a_deprecated_property():
        return peft.get_peft_model(model, config)


def is_lora(model: Any) -> bool:
    """Whether ``model`` is a PEFT model with LoRA adapters."""
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


class AdapterDisabled:
    """The base model of a LoRA model: calls run with the adapter switched off (the KL reference).

    Holds no weights of its own. Usable wherever a causal LM is called for log-probs
    (``agentgym.training.engine.packing.sequence_logprobs``).
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.model.disable_adapter():
            return self.model(*args, **kwargs)

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.model.get_input_embeddings()

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.model.parameters()


def adapter_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's tensors (copies on the CPU), keyed as PEFT saves them."""
    from peft import get_peft_model_state_dict

    return {k: v.detach().cpu().clone() for k, v in get_peft_model_state_dict(model).items()}


def load_adapter_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load ``adapter_state_dict`` output into ``model``'s adapter.

    Raises:
        ConfigError: the state does not fit the adapter (another rank or target modules).
    """
    from peft import set_peft_model_state_dict

    try:
        result = set_peft_model_state_dict(model, state)
    except RuntimeError as exc:
        raise ConfigError(f"the saved LoRA adapter does not fit this model's adapter ({str(exc)[:200]}); "
                          "resume with the model.lora settings the run started with") from None
    unexpected = getattr(result, "unexpected_keys", None) or []
    if unexpected:
        raise ConfigError(f"the saved LoRA adapter has tensors this adapter lacks, e.g. {unexpected[:2]}; "
                          "resume with the model.lora settings the run started with")


def base_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The frozen base weights under the base model's own names (CPU copies), adapter left out."""
    return {k: v.detach().cpu().clone() for k, v in _base_named(model, merged=False)}


def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Base weights with the adapter folded in (W + B·A·alpha/r), under the base model's names.

    Computed beside the model (CPU copies); the model itself is not modified. Weights the base model ties
    (the output projection and the input embeddings of a model with ``tie_word_embeddings``) stay one
    tensor under both names, so a saved model stores them once, as the base model's own save does.
    """
    base = model.get_base_model()
    # Keyed by the storage of the base's own tensors, which the state dict keeps alive meanwhile (a merged
    # weight is a new tensor, whose memory a later one may reuse: it never shares).
    storage = {k.replace(".base_layer.", "."): (v.untyped_storage().data_ptr(), v.storage_offset())
               for k, v in base.state_dict().items() if ".lora_" not in k}
    copies: dict[tuple[int, int], torch.Tensor] = {}
    merged: dict[str, torch.Tensor] = {}
    for key, value in _base_named(model, merged=True):
        if value.untyped_storage().data_ptr() != storage[key][0]:  # the adapter was folded into it
            merged[key] = value.detach().cpu().clone()
            continue
        if storage[key] not in copies:
            copies[storage[key]] = value.detach().cpu().clone()
        merged[key] = copies[storage[key]]
    return merged


def _base_named(model: torch.nn.Module, *, merged: bool) -> Iterator[tuple[str, torch.Tensor]]:
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas: dict[str, torch.Tensor] = {}
    if merged:
        with torch.no_grad():
            for name, module in base.named_modules():
                if isinstance(module, LoraLayer) and ADAPTER in module.lora_A:
                    deltas[f"{name}.weight"] = module.get_delta_weight(ADAPTER)
    for key, value in base.state_dict().items():
        if ".lora_" in key:
            continue
        plain = key.replace(".base_layer.", ".")
        if plain in deltas:
            value = value + deltas[plain].to(value.dtype)
        yield plain, value


def load_base_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load base weights (``base_state_dict`` names) into a LoRA model's frozen base."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    wrapped = {f"{name}." for name, module in base.named_modules() if isinstance(module, LoraLayer)}
    own = base.state_dict()
    renamed = {}
    for key, value in state.items():
        prefix, _, leaf = key.rpartition(".")
        inner = f"{prefix}.base_layer.{leaf}"
        renamed[inner if f"{prefix}." in wrapped and inner in own else key] = value
    missing = [k for k in renamed if k not in own]
    if missing:
        raise ConfigError(f"base weights do not fit this model (e.g. {missing[:2]}); "
                          "same model.path/tiny needed")
    with torch.no_grad():
        for key, value in renamed.items():
            own[key].copy_(value)


def merge_into_base(model: torch.nn.Module) -> None:
    """Fold the adapter into the base weights, in place, and restart the adapter at zero (B = 0).

    The model's output is unchanged (up to rounding); afterwards "adapter disabled" is this model.
    Used after an SFT warm start, so the KL reference is the post-SFT policy.
    """
    from peft.tuners.lora import LoraLayer

    with torch.no_grad():
        for module in model.get_base_model().modules():
            if isinstance(module, LoraLayer) and ADAPTER in module.lora_A:
                weight = module.get_base_layer().weight
                weight.add_(module.get_delta_weight(ADAPTER).to(weight.dtype))
                module.reset_lora_parameters(ADAPTER, init_lora_weights=True)


def load_quantized(cfg: Any, device: Any) -> tuple[torch.nn.Module, Any]:
    """QLoRA: the base model of ``cfg.path`` loaded 4- or 8-bit by bitsandbytes, ready for an adapter.

    Raises:
        ConfigError: no model path, no CUDA device, or bitsandbytes missing.
    """
    if cfg.path is None:
        raise ConfigError("model.lora.quantize needs model.path (a Hugging Face model directory); "
                          "tiny models are built in float32")
    if getattr(device, "type", str(device)) != "cuda":
        raise ConfigError("model.lora.quantize (QLoRA) needs a CUDA device: bitsandbytes quantizes on the "
                          "GPU; set model.lora.quantize=null on this machine")
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise ConfigError("model.lora.quantize needs bitsandbytes: pip install bitsandbytes") from None
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig

    dtype = getattr(torch, cfg.dtype if cfg.dtype != "float32" else "bfloat16")
    quant = (BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype,
                                bnb_4bit_use_double_quant=True)
             if cfg.lora.quantize == "4bit" else BitsAndBytesConfig(load_in_8bit=True))
    model = AutoModelForCausalLM.from_pretrained(cfg.path, quantization_config=quant, dtype=dtype,
                                                 device_map={"": device}, local_files_only=True)
    from peft import prepare_model_for_kbit_training

    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=cfg.gradient_checkpointing)
    return model, AutoTokenizer.from_pretrained(cfg.path, local_files_only=True)


def merged_from_adapter(model: torch.nn.Module, adapter_dir: str) -> dict[str, torch.Tensor]:
    """The weights of plain ``model`` with the PEFT adapter saved in ``adapter_dir`` folded in.

    Only safetensors weights (``adapter_model.safetensors``, what PEFT's ``save_pretrained`` writes)
    are read: a pickled ``adapter_model.bin`` can run code when loaded, and the directory may come
    from a request.

    Raises:
        ConfigError: ``adapter_dir`` holds no adapter, a pickled one, or one that does not load or fits
            another model.
    """
    import copy
    from pathlib import Path

    folder = Path(adapter_dir)
    if not (folder / "adapter_config.json").is_file():
        raise ConfigError(f"'{adapter_dir}' is not a LoRA adapter directory (no adapter_config.json)")
    try:
        json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"'{adapter_dir}/adapter_config.json' is not valid JSON ({exc})") from None
    if not (folder / "adapter_model.safetensors").is_file():
        pickled = (folder / "adapter_model.bin").is_file()
        why = ("; its adapter_model.bin is a pickle, which is not loaded (it can run code): save the adapter "
               "with safetensors (PEFT's save_pretrained does by default)") if pickled else ""
        raise ConfigError(f"'{adapter_dir}' has no adapter_model.safetensors{why}")
    peft = _peft()
    try:
        with _peft_reads_a_deprecated_property():
            adapted = peft.PeftModel.from_pretrained(copy.deepcopy(model), adapter_dir)
    except (ValueError, RuntimeError, KeyError) as exc:
        raise ConfigError(f"the adapter in '{adapter_dir}' does not fit this model: "
                          f"{str(exc)[:200]}") from None
    except Exception as exc:  # noqa: BLE001 - a malformed config or weights file is the adapter's fault
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise ConfigError(f"the adapter in '{adapter_dir}' could not be loaded ({type(exc).__name__}: "
                          f"{first}); save it again with PEFT's save_pretrained") from None
    return merged_state_dict(adapted)
