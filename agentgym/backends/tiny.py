"""Tiny models from a config alone: ``ByteTokenizer``, ``TinyModelConfig``, ``build_tiny_model``, loading.

Nothing here downloads anything. ``build_tiny_model`` makes a small Llama- or Qwen2-style causal LM
over a byte-level tokenizer with a ChatML chat template; ``save_tiny`` writes it as a plain
Hugging Face directory that ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained`` read back without ``trust_remote_code``.
``load_model_and_tokenizer`` accepts either such a directory (or any local HF causal LM with a chat
template) or a ``TinyModelConfig``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.convert_slow_tokenizer import bytes_to_unicode

from agentgym.backends.config import TinyModelConfig
from agentgym.backends.gguf import model_dir
from agentgym.errors import ConfigError

#: ChatML: ``<|im_start|>{role}\n{content}<|im_end|>\n`` per message, then ``<|im_start|>assistant\n``
#: when ``add_generation_prompt`` is set. The model ends its turn by sampling ``<|im_end|>``.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}{{ message['content'] }}{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

PAD_TOKEN = "<|pad|>"
BOS_TOKEN = "<|bos|>"
TURN_START_TOKEN = "<|im_start|>"
TURN_END_TOKEN = "<|im_end|>"
#: The special tokens, in id order after the 256 byte ids. ``<|im_end|>`` ends a turn and is the eos.
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, TURN_START_TOKEN, TURN_END_TOKEN)



def _byte_level_tokenizer() -> Tokenizer:
    """A ``tokenizers`` byte-level BPE with no merges: id ``b`` is byte ``b``, then the special tokens."""
    byte_to_char = bytes_to_unicode()
    vocab = {byte_to_char[b]: b for b in range(256)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    # No regex split and no prefix space: the text's bytes map one to one onto ids, whitespace included.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tokenizer


class ByteTokenizer(PreTrainedTokenizerFast):
    """Byte-level tokenizer: ids 0-255 are the UTF-8 bytes of the text, then four special tokens.

    ``<|pad|>`` (256), ``<|bos|>`` (257), ``<|im_start|>`` (258) and ``<|im_end|>`` (259, the end of
    a turn and the ``eos_token``). Any Unicode text round-trips through ``encode``/``decode``; no
    ``bos`` is added by ``encode``. The ChatML ``chat_template`` (``CHATML_TEMPLATE``) is attached,
    so ``apply_chat_template`` works out of the box. ``save_pretrained`` writes a plain
    ``tokenizer.json`` that ``AutoTokenizer.from_pretrained`` loads (as ``PreTrainedTokenizerFast``)
    without ``trust_remote_code``.

    Example:
        >>> tok = ByteTokenizer()
        >>> tok.encode("hé", add_special_tokens=False)
        [104, 195, 169]
        >>> tok.eos_token, tok.eos_token_id, len(tok)
        ('<|im_end|>', 259, 260)
        >>> tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
        ...                         add_generation_prompt=True)
        '<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n'
    """

    def __init__(self, **kwargs: Any) -> None:
        if "tokenizer_object" not in kwargs and "tokenizer_file" not in kwargs:
            kwargs["tokenizer_object"] = _byte_level_tokenizer()
        kwargs.setdefault("pad_token", PAD_TOKEN)
        kwargs.setdefault("bos_token", BOS_TOKEN)
        kwargs.setdefault("eos_token", TURN_END_TOKEN)
        # Decoding must give back the exact text: no " ." -> "." clean-up.
        kwargs.setdefault("clean_up_tokenization_spaces", False)
        kwargs.setdefault("chat_template", CHATML_TEMPLATE)
        super().__init__(**kwargs)

    def save_pretrained(
        self, save_directory: str | os.PathLike, *args: Any, **kwargs: Any
    ) -> tuple[str, ...]:
        """Save like any fast tokenizer, but name the class ``PreTrainedTokenizerFast`` in the config.

        Everything the tokenizer does lives in ``tokenizer.json``; naming the generic class lets
        ``AutoTokenizer`` load the directory without this module or ``trust_remote_code``.
        """
        files = super().save_pretrained(save_directory, *args, **kwargs)
        config_path = Path(save_directory) / "tokenizer_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8"))
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        config_path.write_text(
            json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8"
        )
        return files


def _hf_config(config: TinyModelConfig, tokenizer: PreTrainedTokenizerBase) -> LlamaConfig | Qwen2Config:
    common: dict[str, Any] = {
        "vocab_size": len(tokenizer),
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "intermediate_size": config.intermediate_size,
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": config.tie_word_embeddings,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if config.arch == "llama":
        return LlamaConfig(**common)
    return Qwen2Config(**common)


def build_tiny_model(config: TinyModelConfig | None = None) -> tuple[PreTrainedModel, ByteTokenizer]:
    """Build a randomly initialised tiny causal LM and its ``ByteTokenizer``.

    The model's vocabulary is exactly the tokenizer's (260 ids), its eos is ``<|im_end|>`` and its
    weights depend only on ``config`` (the global torch RNG is left untouched). It is returned in
    ``eval`` mode, in float32, on the CPU.

    Args:
        config: Shape and seed; ``TinyModelConfig()`` when None.

    Returns:
        ``(model, tokenizer)``: a ``LlamaForCausalLM`` or ``Qwen2ForCausalLM`` and a ``ByteTokenizer``.

    Example:
        >>> model, tok = build_tiny_model(TinyModelConfig(num_layers=1))
        >>> type(model).__name__, model.config.vocab_size == len(tok)
        ('LlamaForCausalLM', True)
    """
    config = TinyModelConfig() if config is None else config
    tokenizer = ByteTokenizer()
    hf_config = _hf_config(config, tokenizer)
    model_cls = LlamaForCausalLM if config.arch == "llama" else Qwen2ForCausalLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = model_cls(hf_config)
    model.agentgym_tiny_config = config
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.eval()
    return model, tokenizer


def save_tiny(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | os.PathLike) -> Path:
    """Write ``model`` (safetensors) and ``tokenizer`` (with its chat template) to the directory ``path``.

    The directory then loads with plain ``AutoModelForCausalLM.from_pretrained(path)`` and
    ``AutoTokenizer.from_pretrained(path)``, or with ``load_model_and_tokenizer(path)``. A
    ``tiny_config.json`` next to them records the ``TinyModelConfig`` when one is known.

    Args:
        model: The model to save (any ``PreTrainedModel``).
        tokenizer: Its tokenizer.
        path: Target directory; created if missing, existing files are overwritten.

    Returns:
        The directory as a ``Path``.

    Example:
        >>> import tempfile
        >>> model, tok = build_tiny_model(TinyModelConfig(num_layers=1))
        >>> with tempfile.TemporaryDirectory() as d:
        ...     m2, t2 = load_model_and_tokenizer(save_tiny(model, tok, d))
        >>> t2.eos_token_id == tok.eos_token_id
        True
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    tiny_config = getattr(model, "agentgym_tiny_config", None)
    if isinstance(tiny_config, TinyModelConfig):
        (path / "tiny_config.json").write_text(
            json.dumps(asdict(tiny_config), indent=2) + "\n", encoding="utf-8"
        )
    return path


def _dtype_kwargs(dtype: torch.dtype | str | None) -> dict[str, Any]:
    if dtype is None:
        return {}
    import transformers

    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    # ``torch_dtype`` was renamed ``dtype`` in transformers 4.56.
    return {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}


def load_model_and_tokenizer(
    source: str | os.PathLike | TinyModelConfig,
    *,
    dtype: torch.dtype | str | None = None,
    device: str | torch.device | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a Hugging Face causal LM directory, or build a tiny model from a ``TinyModelConfig``.

    ``source`` goes through ``agentgym.backends.gguf.model_dir`` first: a packaged model's name, a
    ``.gguf`` file or a Hub id (``org/name[@revision]``, not a local path) becomes a local directory
    there (the Hub id's files in the Hugging Face cache); transformers then reads local files only.

    Args:
        source: A directory holding ``config.json``, weights and a tokenizer with a chat template
            (``chat_template`` in ``tokenizer_config.json`` or a ``chat_template.jinja`` file), or a
            ``TinyModelConfig``.
        dtype: Weight dtype for a directory (``torch.bfloat16``, ``"auto"``...); None keeps the
            transformers default. Tiny models are float32 and cast to ``dtype`` when given.
        device: Where to put the model; None leaves it on the CPU.

    Returns:
        ``(model, tokenizer)``, the model in ``eval`` mode.

    Raises:
        ConfigError: ``source`` is missing, not a directory, has no ``config.json``, no tokenizer
            files, or a tokenizer without a chat template.

    Example:
        >>> model, tok = load_model_and_tokenizer(TinyModelConfig(num_layers=1))
        >>> tok.chat_template is not None
        True
        >>> load_model_and_tokenizer("/nonexistent/model")  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        agentgym.errors.ConfigError: model directory '/nonexistent/model' does not exist; pass a local
        Hugging Face model directory (config.json, weights, tokenizer files with a chat template) or a
        TinyModelConfig
    """
    if isinstance(source, TinyModelConfig):
        model, tokenizer = build_tiny_model(source)
        if dtype is not None and dtype != "auto":
            model = model.to(dtype=dtype if isinstance(dtype, torch.dtype) else getattr(torch, dtype))
    else:
        if not isinstance(source, (str, os.PathLike)):
            raise ConfigError(
                f"source must be a model directory path or a TinyModelConfig, got {type(source).__name__}"
            )
        path = model_dir(source)  # a packaged model's name or a .gguf file: its converted, cached folder
        expected = (
            "pass a local Hugging Face model directory (config.json, weights, tokenizer files "
            "with a chat template) or a TinyModelConfig"
        )
        if not path.exists():
            raise ConfigError(f"model directory '{path}' does not exist; {expected}")
        if not path.is_dir():
            raise ConfigError(f"model path '{path}' is a file, not a directory; {expected}")
        if not (path / "config.json").is_file():
            raise ConfigError(
                f"'{path}' has no config.json, so it is not a Hugging Face model directory; {expected}"
            )
        if not any(
            (path / name).is_file()
            for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
        ):
            raise ConfigError(
                f"'{path}' has no tokenizer files (expected tokenizer.json or "
                f"tokenizer_config.json next to config.json); save the tokenizer there "
                f"with tokenizer.save_pretrained('{path}')"
            )
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                f"the tokenizer in '{path}' has no chat template; agentgym renders prompts with "
                f"apply_chat_template, so it expects 'chat_template' in {path / 'tokenizer_config.json'} "
                f"or a {path / 'chat_template.jinja'} file (set tokenizer.chat_template to a Jinja "
                f"template, e.g. agentgym.backends.tiny.CHATML_TEMPLATE, and save_pretrained again)"
            )
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, **_dtype_kwargs(dtype))
        model.eval()
    if device is not None:
        model = model.to(device)
    return model, tokenizer
