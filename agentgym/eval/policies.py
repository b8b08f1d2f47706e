"""Policy specs for ``agentgym eval``: what ``--policy TEXT`` means, parsed and checked (torch-free).

A policy is one of::

    random                                  uniform over info["admissible_actions"] (see RandomActor)
    expert                                  the env's expert (expert_action)
    http://HOST:PORT/v1[,model=NAME][,api=chat|completions][,tokenizer=DIR]
                                            an OpenAI-compatible endpoint (vLLM, SGLang, serve-policy...)
    DIR                                     a local Hugging Face model directory (with a chat template)
    ORG/NAME[@REVISION]                     a Hugging Face Hub model (not a local path), loaded through
                                            the Hugging Face cache (HF_HUB_CACHE, HF_HUB_OFFLINE)
    RUN | RUN/checkpoint.pt                 an `agentgym train` run folder (its final model/, else its
                                            latest checkpoint) or one checkpoint file

followed by optional ``,key=value`` options: ``name=LABEL`` (the label in reports), prompt settings
(``prompt_mode``, ``window_turns``, ``action_format``, ``include_instructions``,
``show_admissible_actions``, ``tool_messages``, ``system_prompt``, ``max_new_tokens``,
``max_prompt_tokens``), endpoint settings (``timeout_s``, ``max_retries``, ``tools=off``) and local
model settings (``device``, ``dtype``). A run folder brings the prompt settings it trained with, and
so does an endpoint serving one (``agentgym serve-policy RUN`` lists them in ``GET /v1/models``);
options given override them. Such an endpoint also lists the run's env and held-out task settings
(``run_settings``), which become the spec's ``run_config``: ``agentgym eval`` then plays it on the
run's env, kwargs, turn budget and seeds exactly as it plays the run folder.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from agentgym.backends.gguf import PACKAGED_MODELS, is_model_name
from agentgym.backends.hub import as_hub_id
from agentgym.errors import ConfigError
from agentgym.rollout.prompt import PromptSettings
from agentgym.run_folder import RunFolder

PolicyKind = Literal["random", "expert", "endpoint", "model", "run"]


@dataclass(frozen=True)
class PolicySpec:
    """One policy of an evaluation, parsed from its ``--policy`` text."""

    text: str
    """What the user wrote (kept in results.json)."""
    kind: PolicyKind
    """``random``, ``expert``, ``endpoint``, ``model`` (HF directory, Hub id, packaged model or .gguf file) or
    ``run`` (train run / checkpoint)."""
    name: str
    """Label in reports and file names; unique within an evaluation."""
    location: str | None = None
    """Endpoint base URL, model directory, Hub id (``org/name[@revision]``), or checkpoint file."""
    model: str | None = None
    """Endpoint model name (None: the only model the server lists)."""
    api: Literal["chat", "completions"] = "chat"
    """Endpoint API: ``chat`` (the server's chat template) or ``completions`` (token ids; needs
    ``tokenizer``)."""
    tokenizer: str | None = None
    """Endpoint ``completions`` API: the local directory of the served model's tokenizer."""
    timeout_s: float = 60.0
    """Endpoint request deadline."""
    max_retries: int = 2
    """Endpoint retries of failed connections, timeouts and 5xx answers."""
    send_tools: bool = True
    """Chat endpoints: send tool envs' specs as ``tools=`` (``tools=off`` keeps them in the prompt text
    only)."""
    device: str = "auto"
    """Local models: ``auto``, ``cpu``, ``cuda``..."""
    dtype: str = "float32"
    """Local models: parameter dtype."""
    prompt: PromptSettings = field(default_factory=PromptSettings)
    """Prompt rendering and generation settings."""
    run_config: dict[str, Any] | None = None
    """Run folders: the run's ``config.json`` (model, env, rollout, eval sections). Endpoints serving a
    run (``agentgym serve-policy RUN``): the run's ``run_settings`` the server lists. ``agentgym eval``
    takes the envs, turn budget and seeds of every policy that has one, when no flag says otherwise."""

    @property
    def uses_model(self) -> bool:
        """True for policies that generate text (everything but ``random`` and ``expert``)."""
        return self.kind in ("endpoint", "model", "run")

    @property
    def options(self) -> dict[str, str]:
        """The ``,key=value`` options written after the policy (they override what a run brings).

        Example:
            >>> parse_policy("random,name=r").options
            {'name': 'r'}
        """
        return _split_options(self.text)[1]

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict (``from_json`` reads it back)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PolicySpec:
        """Inverse of ``to_json``."""
        prompt = dict(data.get("prompt") or {})
        prompt["stop_strings"] = tuple(prompt.get("stop_strings") or ())
        return cls(**{**data, "prompt": PromptSettings(**prompt)})


_PROMPT_FIELDS = {f.name: f for f in fields(PromptSettings)}
_SPEC_OPTIONS = {"name", "model", "api", "tokenizer", "timeout_s", "max_retries", "tools", "device", "dtype"}
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def _coerce(key: str, value: str, kind: Any) -> Any:
    text = str(kind)
    if "bool" in text:
        if value.lower() in _TRUE | _FALSE:
            return value.lower() in _TRUE
        raise ConfigError(f"policy option {key}={value!r} must be true or false")
    if text.startswith("int") or text == "<class 'int'>":
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"policy option {key}={value!r} must be an integer") from None
    if "float" in text:
        try:
            return float(value)
        except ValueError:
            raise ConfigError(f"policy option {key}={value!r} must be a number") from None
    if "tuple" in text:
        return tuple(s for s in value.split("|") if s)
    return None if value.lower() == "none" else value


def _split_options(text: str) -> tuple[str, dict[str, str]]:
    head, *rest = text.split(",")
    options: dict[str, str] = {}
    for item in rest:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"policy {text!r}: option {item!r} is not key=value (e.g. name=mine)")
        options[key] = value.strip()
    return head.strip(), options


def _apply_options(spec: PolicySpec, options: dict[str, str]) -> PolicySpec:
    prompt_updates: dict[str, Any] = {}
    updates: dict[str, Any] = {}
    for key, value in options.items():
        if key in _PROMPT_FIELDS:
            prompt_updates[key] = _coerce(key, value, _PROMPT_FIELDS[key].type)
        elif key in _SPEC_OPTIONS:
            if key == "tools":
                updates["send_tools"] = _coerce(key, value, "bool")
            elif key in ("timeout_s", "max_retries"):
                updates[key] = _coerce(key, value, "float" if key == "timeout_s" else "int")
            else:
                updates[key] = value
        else:
            known = sorted(_SPEC_OPTIONS | set(_PROMPT_FIELDS))
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else f" Options: {', '.join(known)}"
            raise ConfigError(f"policy {spec.text!r}: unknown option {key!r}.{hint}")
    if prompt_updates:
        updates["prompt"] = replace(spec.prompt, **prompt_updates)
    spec = replace(spec, **updates)
    if spec.api not in ("chat", "completions"):
        raise ConfigError(f"policy {spec.text!r}: api must be 'chat' or 'completions', got {spec.api!r}")
    if spec.prompt.prompt_mode not in ("window", "full", "current"):
        raise ConfigError(f"policy {spec.text!r}: prompt_mode must be window, full or current")
    if spec.prompt.action_format not in (None, "plain", "tag", "raw"):
        raise ConfigError(f"policy {spec.text!r}: action_format must be plain, tag or raw")
    if spec.kind == "endpoint" and spec.api == "completions" and not spec.tokenizer:
        raise ConfigError(f"policy {spec.text!r}: api=completions sends token ids, so it needs the served "
                          "model's tokenizer: add tokenizer=DIR (or use api=chat)")
    if spec.prompt.max_new_tokens < 1:
        raise ConfigError(f"policy {spec.text!r}: max_new_tokens must be >= 1")
    return spec


def run_prompt_settings(config: dict[str, Any]) -> PromptSettings:
    """The prompt settings of a run, from its ``config.json`` (the ``rollout`` section's prompt fields)."""
    rollout = config.get("rollout") or {}
    return _known_prompt_settings(rollout if isinstance(rollout, dict) else {})


def _known_prompt_settings(values: dict[str, Any]) -> PromptSettings:
    known = {k: v for k, v in values.items() if k in _PROMPT_FIELDS}
    known["stop_strings"] = tuple(str(s) for s in known.get("stop_strings") or ())
    return replace(PromptSettings(), **known)


#: What ``run_settings`` keeps of a run's config.json: the settings ``agentgym eval`` applies to a run
#: folder's envs and tasks (never ``env.token``, ``env.url`` or other details of the training machine).
RUN_SETTINGS: dict[str, tuple[str, ...]] = {
    "env": ("id", "kwargs", "max_turns", "harness", "tasks", "judge"),
    "eval": ("seed_offset", "split"),
}


def run_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The env and held-out task settings of a run, from its ``config.json``: the parts ``agentgym eval``
    applies to a run folder (its env's id, kwargs, turn budget, harness and judge; the ``eval`` section's
    ``seed_offset`` and ``split``), which ``agentgym serve-policy RUN`` lists for clients (``RUN_SETTINGS``
    names the keys).

    Example:
        >>> run_settings({"env": {"id": "maze-v0", "kwargs": {"size": 2}, "max_turns": 10, "token": "s3"},
        ...               "eval": {"seed_offset": 1000000, "num_episodes": 64}, "rollout": {}})
        {'env': {'id': 'maze-v0', 'kwargs': {'size': 2}, 'max_turns': 10}, 'eval': {'seed_offset': 1000000}}
    """
    kept: dict[str, Any] = {}
    for section, keys in RUN_SETTINGS.items():
        values = config.get(section)
        if isinstance(values, dict):
            kept[section] = {key: values[key] for key in keys if values.get(key) is not None}
    return kept


def _served_entry(base_url: str, model: str | None, timeout_s: float) -> dict[str, Any] | None:
    """The ``agentgym`` part of the ``GET /models`` entry of ``model`` (of the only settings listed when
    ``model`` is None); None when there is none, the entries differ, or the server cannot be asked."""
    import os

    import httpx

    key = os.environ.get("OPENAI_API_KEY")
    try:
        answer = httpx.get(f"{base_url}/models", headers={"Authorization": f"Bearer {key}"} if key else {},
                           timeout=timeout_s)
        entries = answer.json()["data"] if answer.status_code == 200 else []
        listed = [e.get("agentgym") for e in entries if model in (None, e.get("id"))]
    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not listed or not isinstance(listed[0], dict) or any(p != listed[0] for p in listed):
        return None  # several models with different settings and none named: the user must choose
    return listed[0]


def _prompt_of(entry: dict[str, Any] | None) -> PromptSettings | None:
    prompt = (entry or {}).get("prompt")
    if not isinstance(prompt, dict):
        return None
    try:
        return _known_prompt_settings(prompt)
    except TypeError:
        return None


def _run_of(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    """A served run's settings, if they are a run's (an env section naming the env)."""
    run = (entry or {}).get("run")
    if not isinstance(run, dict) or not isinstance(run.get("env"), dict):
        return None
    if not isinstance(run["env"].get("id"), str) or not isinstance(run.get("eval", {}), dict):
        return None
    return run_settings(run)


def served_prompt_settings(base_url: str, model: str | None, *,
                           timeout_s: float = 5.0) -> PromptSettings | None:
    """The prompt settings an endpoint lists for ``model`` (``agentgym.prompt`` in its ``GET /models``
    entries, as ``agentgym serve-policy`` on a run folder does); None when it lists none or cannot be
    asked (``eval`` then reports an unreachable server itself). Sends ``OPENAI_API_KEY`` as the
    endpoint policy does."""
    return _prompt_of(_served_entry(base_url, model, timeout_s))


def _read_run_config(folder: Path, text: str) -> dict[str, Any]:
    path = RunFolder(folder).config
    if not path.is_file():
        raise ConfigError(f"policy {text!r}: {folder} has a checkpoint but no config.json; is it an "
                          "`agentgym train` run folder?")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        config = None  # reported below, with every other file that is not a JSON object
    if not isinstance(config, dict):
        raise ConfigError(f"policy {text!r}: {path} is not a run config (not a JSON object: a write cut "
                          "short?); restore it, or evaluate the run's model/ folder as a model directory")
    return config


def parse_policy(text: str) -> PolicySpec:
    """Parse one ``--policy`` value (see the module docstring).

    Raises:
        ConfigError: an unknown kind, a path that is neither a model nor a run, a bad option.

    Example:
        >>> parse_policy("random").kind
        'random'
        >>> spec = parse_policy("http://127.0.0.1:8001/v1,model=qwen,name=served,max_new_tokens=64")
        >>> spec.kind, spec.model, spec.name, spec.prompt.max_new_tokens
        ('endpoint', 'qwen', 'served', 64)
        >>> parse_policy("gpt-4")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        agentgym.errors.ConfigError: policy 'gpt-4' is not random, expert, ... (no such path)
    """
    head, options = _split_options(text)
    if head in ("random", "expert"):
        spec = PolicySpec(text, head, head)  # type: ignore[arg-type]
    elif head.startswith(("http://", "https://")):
        spec = PolicySpec(text, "endpoint", options.get("model") or head.split("//", 1)[1].split("/", 1)[0],
                          location=head.rstrip("/"))
        # A served run brings what its folder would: prompt settings, and the env and tasks it played.
        entry = _served_entry(head.rstrip("/"), options.get("model"), 5.0)
        served, run = _prompt_of(entry), _run_of(entry)
        if served is not None:
            spec = replace(spec, prompt=served)
        if run is not None:
            spec = replace(spec, run_config=run)
    else:
        spec = _parse_path(text, head)
    return _apply_options(spec, options)


def _parse_path(text: str, head: str) -> PolicySpec:
    if is_model_name(head):  # a packaged model or a .gguf file: converted once when it is loaded
        if head.endswith(".gguf") and not Path(head).is_file():
            raise ConfigError(f"policy {text!r}: no such .gguf file")
        return PolicySpec(text, "model", Path(head).stem if head.endswith(".gguf") else head, location=head)
    hub = as_hub_id(head)  # org/name[@revision] that is no local path: loaded through the Hugging Face cache
    if hub is not None:
        # The label names files (trajectories/ENV/LABEL.jsonl): a revision like refs/pr/1 loses its slashes.
        label = hub.repo_id.split("/", 1)[1] + (f"@{hub.revision.replace('/', '-')}" if hub.revision else "")
        return PolicySpec(text, "model", label, location=str(hub))
    path = Path(head)
    if path.is_file() and path.suffix == ".pt":
        config = _read_run_config(path.parent, text)
        return PolicySpec(text, "run", f"{path.parent.name}@{path.stem}", location=str(path),
                          prompt=run_prompt_settings(config), run_config=config)
    if not path.is_dir():
        lead = head.split(",")[0]
        if head.split(":")[0] in ("ftp", "ws", "http", "https") or "://" in head:
            raise ConfigError(f"policy {text!r}: endpoints must be http:// or https:// URLs")
        close = difflib.get_close_matches(lead, ["random", "expert", *PACKAGED_MODELS], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else " (no such path)"
        raise ConfigError(f"policy {text!r} is not random, expert, an http(s):// endpoint, a packaged model "
                          f"({', '.join(PACKAGED_MODELS)}), a .gguf file, a model directory, a Hub id "
                          f"(org/name) or a run folder{hint}")
    run = RunFolder(path)
    if run.checkpoint.is_file() or run.report.is_file():
        config = _read_run_config(path, text)
        location = str(run.model if run.has_model() else run.checkpoint)
        if not Path(location).exists():
            raise ConfigError(f"policy {text!r}: run folder {path} has neither model/ nor checkpoint.pt")
        return PolicySpec(text, "run", path.resolve().name, location=location,
                          prompt=run_prompt_settings(config), run_config=config)
    if (path / "config.json").is_file():
        return PolicySpec(text, "model", path.resolve().name, location=str(path))
    raise ConfigError(f"policy {text!r}: directory {path} has neither config.json (a Hugging Face model) nor "
                      "checkpoint.pt (an `agentgym train` run)")


def unique_names(specs: list[PolicySpec]) -> list[PolicySpec]:
    """Check that labels are unique (reports and files are keyed by them).

    Raises:
        ConfigError: two policies share a name; says how to rename one.
    """
    seen: dict[str, str] = {}
    for spec in specs:
        if spec.name in seen:
            raise ConfigError(f"policies {seen[spec.name]!r} and {spec.text!r} are both named {spec.name!r}; "
                              f"add ,name=LABEL to one of them")
        seen[spec.name] = spec.text
    return specs
