"""Models named by their Hugging Face Hub id (``org/name``, optionally ``org/name@revision``), fetched into
and loaded from the Hugging Face cache (torch-free; ``huggingface_hub`` is imported on first use).

Wherever a model is asked for (``model.path``, ``agentgym eval``'s policies, ``serve-policy``), a text that
is not an existing local path and reads ``org/name`` is a Hub id. ``snapshot_dir`` returns the folder of
that model's files in the cache (``models--org--name/snapshots/<commit>/``), downloading what is missing
(configuration, tokenizer and chat template files and the weights, safetensors where the model has them;
no subfolders), so every loader then reads a plain local directory.

The Hugging Face variables are read when a model is resolved, not when a library is imported:
``HF_HUB_CACHE`` (else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``) is the cache, ``HF_HUB_OFFLINE=1``
(or ``TRANSFORMERS_OFFLINE=1``) loads from the cache only, ``HF_ENDPOINT`` names a mirror, ``HF_TOKEN``
opens private and gated models.

Example:
    >>> parse_hub_id("Qwen/Qwen2.5-0.5B-Instruct@v1.0")
    HubId(repo_id='Qwen/Qwen2.5-0.5B-Instruct', revision='v1.0')
    >>> parse_hub_id("smollm2") is None, parse_hub_id("./runs/quickstart") is None
    (True, True)
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from agentgym.errors import ConfigError

#: ``org/name`` as the Hub spells a model id: letters, digits, ``-``, ``_`` and ``.``, each part starting
#: and ending with a letter or digit (no ``--`` or ``..`` anywhere, as the Hub refuses them).
_REPO_ID = re.compile(r"[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9])?/[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9])?")
#: Top-level files a causal LM loads from: its configuration, tokenizer, chat template and safetensors
#: weights. Repositories also hold ONNX or GGUF exports and older duplicate formats; those are not fetched.
_MODEL_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]
#: Weights of models that have no safetensors files.
_PICKLED_WEIGHTS = ["*.bin"]
_SUBFOLDERS = ["*/*"]
_TRUE = {"1", "ON", "YES", "TRUE"}


@dataclass(frozen=True)
class HubId:
    """A model on the Hugging Face Hub."""

    repo_id: str
    """``org/name``."""
    revision: str | None = None
    """A branch, tag or commit hash; None is the default branch (``main``)."""

    def __str__(self) -> str:
        return self.repo_id if self.revision is None else f"{self.repo_id}@{self.revision}"


def parse_hub_id(text: str) -> HubId | None:
    """The Hub id ``text`` spells (``org/name`` or ``org/name@revision``), or None: a lexical test only,
    which says nothing of whether a local path of that name exists (``as_hub_id`` does).

    Example:
        >>> parse_hub_id("HuggingFaceTB/SmolLM2-135M-Instruct@refs/pr/1").revision
        'refs/pr/1'
        >>> [parse_hub_id(t) for t in ("a/b/c", "/abs/dir", "org/name.gguf", "org/", "a--b/c")]
        [None, None, None, None, None]
    """
    repo_id, sep, revision = str(text).partition("@")
    if not _REPO_ID.fullmatch(repo_id) or "--" in repo_id or ".." in repo_id:
        return None
    if repo_id.endswith((".git", ".gguf")) or (sep and not revision.strip()) or revision != revision.strip():
        return None
    return HubId(repo_id, revision or None)


def as_hub_id(source: str | os.PathLike[str]) -> HubId | None:
    """The Hub id ``source`` names, or None when it is an existing local path (a path is a path) or does
    not read ``org/name[@revision]``."""
    text = os.fspath(source)
    if Path(text).exists():
        return None
    return parse_hub_id(text)


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache as the environment names it now: ``HF_HUB_CACHE``, else the older
    ``HUGGINGFACE_HUB_CACHE``, else ``HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else
    ``~/.cache/huggingface/hub`` (``huggingface_hub`` reads the same variables, but once, at import)."""
    folder = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if not folder:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        home = os.environ.get("HF_HOME") or os.path.join(xdg, "huggingface")
        folder = os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(folder)))


def offline_variable() -> str | None:
    """The variable that forbids downloads now (``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` set to 1,
    on, yes or true), or None."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(name, "").strip().upper() in _TRUE:
            return name
    return None


def _shown(folder: Path) -> str:
    home = os.path.expanduser("~")
    text = str(folder)
    return "~" + text[len(home):] if home not in ("", "/") and text.startswith(home + os.sep) else text


def snapshot_dir(hub: HubId | str, revision: str | None = None) -> Path:
    """The local folder of ``hub``'s files in the Hugging Face cache, downloaded first where they are
    missing (unless offline).

    Args:
        hub: a ``HubId`` or its text (``org/name[@revision]``).
        revision: a branch, tag or commit hash (``model.revision``); it must agree with one written after
            ``@``.

    Returns:
        ``<cache>/models--org--name/snapshots/<commit>``.

    Raises:
        ConfigError: one line naming the model and the fix: not cached while ``HF_HUB_OFFLINE`` forbids
            downloading, the Hub unreachable, no such model or revision, a gated model, a cached copy
            without ``config.json``.
    """
    parsed = parse_hub_id(hub) if isinstance(hub, str) else hub
    if parsed is None:
        raise ConfigError(f"{hub!r} is not a Hugging Face Hub id; write it as org/name or org/name@revision")
    if revision is not None and parsed.revision is not None and revision != parsed.revision:
        raise ConfigError(f"model {str(parsed)!r} names revision {parsed.revision!r} but model.revision is "
                          f"{revision!r}: give the revision in one place")
    hub = HubId(parsed.repo_id, parsed.revision or revision)
    try:
        import huggingface_hub
        from huggingface_hub import errors
    except ImportError:
        raise ConfigError(f"loading model {str(hub)!r} from the Hugging Face Hub needs huggingface_hub: "
                          "pip install huggingface_hub (or: pip install 'agentgym-rl[train]')") from None
    cache = hub_cache_dir()
    offline = offline_variable()
    endpoint = (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
    fetch = f"`hf download {hub.repo_id}{f' --revision {hub.revision}' if hub.revision else ''}`"
    which = f"{hub.repo_id!r}" + (f" (revision {hub.revision!r})" if hub.revision else "")
    where = f"the Hugging Face cache ({_shown(cache)}, set by HF_HUB_CACHE or HF_HOME)"
    not_local = f"'{hub}' is no local directory either"

    def download(patterns: list[str]) -> Path:
        return Path(huggingface_hub.snapshot_download(
            hub.repo_id, revision=hub.revision, cache_dir=cache, local_files_only=offline is not None,
            allow_patterns=patterns, ignore_patterns=_SUBFOLDERS, endpoint=endpoint))

    incomplete = getattr(errors, "IncompleteSnapshotError", ())  # huggingface_hub >= 1.x
    try:
        folder = download(_MODEL_FILES)
        if offline is None and not any(folder.glob("*.safetensors")):
            folder = download(_PICKLED_WEIGHTS)
    except incomplete as exc:
        reason = (f"{offline}=1 forbids completing it" if offline else
                  f"the Hub ({endpoint}) cannot be reached ({_cause(exc)})")
        raise ConfigError(f"model {which} is only partly in {where} (a download cut short) and {reason}: "
                          f"complete it with {fetch}" + (f" after unsetting {offline}" if offline else "")
                          ) from None
    except errors.LocalEntryNotFoundError as exc:
        if offline:
            raise ConfigError(f"model {which} is not in {where} and {offline}=1 forbids downloading it "
                              f"({not_local}): unset {offline}, or download it first with {fetch}") from None
        raise ConfigError(f"model {which} is not in {where} and the Hub ({endpoint}) cannot be reached "
                          f"({_cause(exc)}; {not_local}): check the network (or HF_ENDPOINT for a mirror), "
                          f"or run {fetch} where there is one and copy the cache here") from None
    except errors.GatedRepoError:
        raise ConfigError(f"model {which} is gated on the Hub: accept its terms at {endpoint}/{hub.repo_id}, "
                          "then log in with `hf auth login` (or set HF_TOKEN)") from None
    except errors.RepositoryNotFoundError:
        raise ConfigError(f"model {which} is not on the Hugging Face Hub ({endpoint}) and {not_local}; check "
                          "the spelling (a private model needs `hf auth login` or HF_TOKEN)") from None
    except errors.RevisionNotFoundError:
        raise ConfigError(f"model {hub.repo_id!r} has no revision {hub.revision!r} on the Hub: give a "
                          "branch, tag or commit hash it has (model.revision or org/name@revision)") from None
    except (errors.HfHubHTTPError, OSError, ValueError) as exc:
        raise ConfigError(f"fetching model {which} into {where} failed: {_cause(exc)}") from None
    if not (folder / "config.json").is_file():
        raise ConfigError(f"the cached copy of model {which} ({folder}) has no config.json, so it is not a "
                          f"transformers model (or its download was cut short): run {fetch}")
    return folder


def _cause(exc: BaseException) -> str:
    """The first line of the innermost cause: huggingface_hub wraps a refused connection in two layers."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    first = (str(exc).strip().splitlines() or ["no message"])[0][:200]
    return f"{type(exc).__name__}: {first}"

