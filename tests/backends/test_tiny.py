"""Tiny models from configs: the byte tokenizer, its chat template, deterministic builds, save/load."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

# After the skips above, so that a missing torch or transformers skips this file instead of failing it.
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from agentgym.backends.tiny import (  # noqa: E402
    CHATML_TEMPLATE,
    SPECIAL_TOKENS,
    ByteTokenizer,
    TinyModelConfig,
    build_tiny_model,
    load_model_and_tokenizer,
    save_tiny,
)
from agentgym.errors import ConfigError  # noqa: E402

TEXTS = [
    "",
    "hello world",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\n",
    "héllo wörld — “quotes” ½",
    "中文 日本語 한국어",
    "emoji 🎉👩‍👩‍👧 flags 🇫🇷",
    "combining e\u0301 and zero\u200bwidth",
    "\x00\x01\x7f control bytes",
    "looks special but is not: <|im_end without bar",
]

MESSAGES = [
    {"role": "system", "content": "You play a game."},
    {"role": "user", "content": "Move?"},
    {"role": "assistant", "content": "left"},
    {"role": "user", "content": "ok 🎲"},
]


def _ids(out: object) -> list[int]:
    """``apply_chat_template(tokenize=True)`` returns ids or (transformers >= 5) a BatchEncoding."""
    return list(out["input_ids"]) if isinstance(out, Mapping) else list(out)  # type: ignore[index,call-overload]


@pytest.fixture(scope="module")
def tokenizer() -> ByteTokenizer:
    return ByteTokenizer()


# --- tokenizer -----------------------------------------------------------------------------------


@pytest.mark.parametrize("text", TEXTS)
def test_byte_round_trip(tokenizer: ByteTokenizer, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids == list(text.encode("utf-8"))
    assert tokenizer.decode(ids) == text


def test_special_tokens_are_single_ids(tokenizer: ByteTokenizer) -> None:
    assert len(tokenizer) == 256 + len(SPECIAL_TOKENS)
    for offset, token in enumerate(SPECIAL_TOKENS):
        assert tokenizer.encode(token, add_special_tokens=False) == [256 + offset]
        assert tokenizer.convert_ids_to_tokens(256 + offset) == token
    assert tokenizer.pad_token_id == tokenizer.convert_tokens_to_ids("<|pad|>")
    assert tokenizer.bos_token_id == tokenizer.convert_tokens_to_ids("<|bos|>")
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = tokenizer.encode("a<|im_start|>b<|im_end|>", add_special_tokens=False)
    assert ids == [97, 258, 98, 259]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "ab"
    assert tokenizer.encode("x") == [120], "encode must not add bos/eos"


def test_chat_template_renders_chatml(tokenizer: ByteTokenizer) -> None:
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False)
    assert text == (
        "<|im_start|>system\nYou play a game.<|im_end|>\n"
        "<|im_start|>user\nMove?<|im_end|>\n"
        "<|im_start|>assistant\nleft<|im_end|>\n"
        "<|im_start|>user\nok 🎲<|im_end|>\n"
    )
    prompt = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert prompt == text + "<|im_start|>assistant\n"
    ids = _ids(tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True))
    assert ids == tokenizer.encode(prompt, add_special_tokens=False)
    assert ids.count(tokenizer.eos_token_id) == len(MESSAGES)
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == len(MESSAGES) + 1


def test_tokenizer_save_load_round_trip(tokenizer: ByteTokenizer, tmp_path: Path) -> None:
    tokenizer.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"  # loads without this module
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.chat_template == tokenizer.chat_template == CHATML_TEMPLATE
    assert len(loaded) == len(tokenizer)
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        assert getattr(loaded, name) == getattr(tokenizer, name)
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert loaded.encode(text, add_special_tokens=False) == ids
        assert loaded.decode(ids) == text
    assert _ids(loaded.apply_chat_template(MESSAGES, add_generation_prompt=True)) == _ids(
        tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    )


# --- model ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_build_is_deterministic_under_seed(arch: str) -> None:
    rng_before = torch.get_rng_state()
    model_a, tok = build_tiny_model(TinyModelConfig(arch=arch, seed=3))
    model_b, _ = build_tiny_model(TinyModelConfig(arch=arch, seed=3))
    model_c, _ = build_tiny_model(TinyModelConfig(arch=arch, seed=4))
    assert torch.equal(torch.get_rng_state(), rng_before), "the global RNG must be left alone"
    assert type(model_a).__name__ == {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[arch]
    assert model_a.config.vocab_size == len(tok)
    assert model_a.config.eos_token_id == tok.eos_token_id
    a, b, c = model_a.state_dict(), model_b.state_dict(), model_c.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
    assert not model_a.training


def test_default_size_is_tiny() -> None:
    model, _ = build_tiny_model()
    assert sum(p.numel() for p in model.parameters()) < 1_000_000


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_save_then_plain_from_pretrained_gives_identical_logits(arch: str, tmp_path: Path) -> None:
    model, tok = build_tiny_model(TinyModelConfig(arch=arch, seed=1))
    save_tiny(model, tok, tmp_path)
    assert json.loads((tmp_path / "tiny_config.json").read_text())["arch"] == arch
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    loaded_tok = AutoTokenizer.from_pretrained(tmp_path)
    ids = torch.tensor([_ids(loaded_tok.apply_chat_template(MESSAGES, add_generation_prompt=True))])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    via_helper, helper_tok = load_model_and_tokenizer(tmp_path)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, via_helper(ids).logits)
    assert helper_tok.chat_template == CHATML_TEMPLATE
    assert not via_helper.training


def test_load_from_config_and_dtype() -> None:
    model, tok = load_model_and_tokenizer(TinyModelConfig(num_layers=1), dtype=torch.bfloat16)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert tok.chat_template == CHATML_TEMPLATE


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"arch": "gpt2"}, "arch"),
        ({"hidden_size": 0}, "hidden_size"),
        ({"num_heads": 3}, "num_heads"),
        ({"num_kv_heads": 3}, "num_kv_heads"),
    ],
)
def test_config_validation_names_the_field(changes: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        TinyModelConfig(**changes)


# --- load errors -------------------------------------------------------------------------------


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist.*local Hugging Face model directory"):
        load_model_and_tokenizer(tmp_path / "nope")


def test_file_instead_of_directory(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ConfigError, match="is a file, not a directory"):
        load_model_and_tokenizer(tmp_path / "weights.bin")


def test_directory_without_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no config.json"):
        load_model_and_tokenizer(tmp_path)


def test_directory_without_tokenizer(tmp_path: Path) -> None:
    model, _ = build_tiny_model(TinyModelConfig(num_layers=1))
    model.save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="no tokenizer files"):
        load_model_and_tokenizer(tmp_path)


def test_directory_without_chat_template(tmp_path: Path) -> None:
    model, tok = build_tiny_model(TinyModelConfig(num_layers=1))
    save_tiny(model, tok, tmp_path)
    (tmp_path / "chat_template.jinja").unlink(missing_ok=True)
    config_path = tmp_path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config))
    assert AutoTokenizer.from_pretrained(tmp_path).chat_template is None
    with pytest.raises(ConfigError, match="no chat template") as info:
        load_model_and_tokenizer(tmp_path)
    message = str(info.value)
    assert str(tmp_path / "tokenizer_config.json") in message and "chat_template.jinja" in message


def test_wrong_source_type() -> None:
    with pytest.raises(ConfigError, match="TinyModelConfig"):
        load_model_and_tokenizer(42)  # type: ignore[arg-type]
