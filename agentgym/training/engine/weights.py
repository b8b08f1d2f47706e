"""What a run saves of its model, for full fine-tuning and for LoRA alike.

Full fine-tuning checkpoints every weight and keeps a frozen copy as the KL reference. A LoRA run
(``model.lora``) checkpoints only the adapter, and its reference is the same module with the
adapter switched off (``agentgym.backends.lora``); when an SFT warm start changed the base weights
(folded in from the SFT adapter), those base weights are saved once, in the reference file.
"""

from __future__ import annotations

import copy
import errno
import shutil
from pathlib import Path
from typing import Any

import torch

from agentgym.backends.lora import (
    AdapterDisabled,
    adapter_state_dict,
    base_state_dict,
    is_lora,
    load_adapter_state,
    load_base_state,
    merge_into_base,
    merged_state_dict,
)
from agentgym.errors import ConfigError
from agentgym.run_folder import RunFolder


def write_torch(obj: Any, path: Path) -> Path:
    """``torch.save`` to ``path`` atomically (a temporary file, then a rename).

    Raises:
        OSError: the write failed (a full disk...): one line naming ``path``; the file there is untouched.
    """
    tmp = path.with_name(path.name + ".tmp")
    try:
        torch.save(obj, tmp)
    except (OSError, RuntimeError) as exc:  # torch's writer reports a failed write as a RuntimeError
        tmp.unlink(missing_ok=True)
        raise write_error(exc, path) from None
    return tmp.replace(path)


def write_error(exc: BaseException, path: Path) -> OSError:
    """``exc`` (raised while writing ``path``) as an ``OSError`` naming the file, on one line; a full disk is
    said to be one."""
    code = getattr(exc, "errno", None)
    try:
        full = shutil.disk_usage(path.parent).free < (1 << 20)
    except OSError:
        full = False
    if full or code == errno.ENOSPC:
        return OSError(errno.ENOSPC, "no space left on the device", str(path))
    reason = getattr(exc, "strerror", None) or str(exc).splitlines()[0]
    return OSError(code or errno.EIO, reason, str(path))


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters the optimiser updates (all of them, or a LoRA adapter's)."""
    return [p for p in model.parameters() if p.requires_grad]


def model_state(model: torch.nn.Module) -> dict[str, Any]:
    """The checkpoint entry of the model: ``{"model": state dict}`` or ``{"adapter": adapter tensors}``."""
    if is_lora(model):
        return {"adapter": adapter_state_dict(model)}
    return {"model": model.state_dict()}


def load_model_state(model: torch.nn.Module, state: dict[str, Any]) -> None:
    """Reinstate ``model_state`` output from a checkpoint.

    Raises:
        ConfigError: a full checkpoint for a LoRA run or the other way round.
    """
    if is_lora(model):
        if "adapter" not in state:
            raise ConfigError("this checkpoint holds full weights but model.lora is set; resume without "
                              "model.lora")
        load_adapter_state(model, state["adapter"])
    else:
        if "model" not in state:
            raise ConfigError("this checkpoint holds a LoRA adapter but model.lora is not set; resume with "
                              "the model.lora settings the run started with")
        model.load_state_dict(state["model"])


def save_reference(model: torch.nn.Module, path: Path, *, sft_ran: bool, needed: bool = True,
                   write: bool = True) -> None:
    """Save what the KL reference is rebuilt from when a run resumes.

    Full fine-tuning: the weights now (post-SFT), only when ``needed`` (a loss term compares with the
    reference): a run without one writes no copy of the model (538 MB for a 135 M-parameter model).
    LoRA: the SFT adapter is folded into the base first (so "adapter off" is the post-SFT policy), and the
    base weights are saved if SFT changed them, needed or not (a resumed run rebuilds its base from them).
    ``write=False`` (the other processes of a multi-process run) changes the model the same way but
    writes nothing.
    """
    if not is_lora(model):
        if write and needed:
            write_torch(model.state_dict(), path)
        return
    if sft_ran:
        merge_into_base(model)
        if write:
            write_torch({"lora_base": base_state_dict(model)}, path)


def restore_reference_base(model: torch.nn.Module, state: dict[str, Any]) -> None:
    """LoRA: put back the post-SFT base weights (``reference.pt``'s ``lora_base``) a resumed run's model was
    built without."""
    load_base_state(model, state["lora_base"])


def reference_model(model: torch.nn.Module, state: dict[str, Any] | None) -> Any:
    """The frozen KL reference: the adapter switched off (LoRA; ``state`` unused) or a frozen copy of the
    model with the saved weights ``state`` (``reference.pt``)."""
    if is_lora(model):
        return AdapterDisabled(model)
    current = copy.deepcopy(model.state_dict())
    model.load_state_dict(state)
    reference = copy.deepcopy(model).eval()
    reference.requires_grad_(False)
    model.load_state_dict(current)
    return reference


def save_pretrained(model: torch.nn.Module, tokenizer: Any, folder: RunFolder) -> None:
    """The trained model as a plain Hugging Face directory, the run folder's ``model/`` (LoRA: merged weights,
    and the adapter alone in ``adapter/``, the form vLLM loads with ``--enable-lora``)."""
    if is_lora(model):
        model.save_pretrained(folder.adapter)
        model.get_base_model().save_pretrained(folder.model, state_dict=merged_state_dict(model))
    else:
        model.save_pretrained(folder.model)
    tokenizer.save_pretrained(folder.model)
