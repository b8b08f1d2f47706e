"""Training configuration: typed config objects, YAML loading and ``--set key=value`` overrides.

``TrainConfig`` is the whole run. Every field has a default and a docstring; YAML presets in
``configs/`` are flat, complete files. Errors name the field to fix (``rollout.group_size``) and
suggest the nearest field name for typos.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import yaml

from agentgym.errors import ConfigError


@dataclass
class ModelConfig:
    """Which policy model to train."""

    path: str | None = None
    """Local Hugging Face model directory (with a chat template); None builds the tiny model below."""
    arch: Literal["llama", "qwen2"] = "llama"
    """Tiny model architecture."""
    hidden_size: int = 128
    """Tiny model width."""
    num_layers: int = 2
    """Tiny model depth."""
    num_heads: int = 4
    """Tiny model attention heads."""
    num_kv_heads: int = 2
    """Tiny model key/value heads (grouped-query attention)."""
    intermediate_size: int = 384
    """Tiny model MLP width."""
    max_position_embeddings: int = 2048
    """Longest sequence the tiny model handles (tokens)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype."""
    device: str = "auto"
    """``auto`` (cuda when available, else cpu), ``cpu``, ``cuda``, ``cuda:1``..."""


@dataclass
class EnvConfig:
    """The environment the agent trains and is evaluated on."""

    id: str = "maze-v0"
    """Registered env id."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Env constructor arguments."""
    max_turns: int | None = None
    """Override the env spec's turn budget."""
    url: str | None = None
    """Use sessions on an env service at this URL instead of in-process envs."""
    token: str | None = None
    """Bearer token for ``url``."""


@dataclass
class RolloutConfig:
    """How episodes are collected."""

    num_tasks: int = 8
    """B: tasks (seeds) per iteration."""
    group_size: int = 8
    """G: episodes per task (same seed), the group of group-relative estimators."""
    prompt_mode: Literal["window", "full", "current"] = "window"
    """``window``: task + last ``window_turns`` turns each turn; ``full``: the whole chat;
    ``current``: the current observation only (for envs whose observation is a sufficient state)."""
    window_turns: int = 2
    """History turns shown in ``window`` mode."""
    action_format: Literal["plain", "tag"] = "plain"
    """``plain``: the response is the action; ``tag``: ``<action>…</action>``."""
    include_instructions: bool = True
    """Put the env's ``instructions`` in the system message (tiny models may do better without)."""
    show_admissible_actions: bool = True
    """List ``info["admissible_actions"]`` under each observation."""
    tool_messages: bool = True
    """Tool envs (``info["tools"]``): pass the tool specs to the chat template and, in ``full`` mode,
    render observations after the first as ``tool`` messages."""
    system_prompt: str | None = None
    """Extra system text placed first."""
    max_new_tokens: int = 16
    """Generation cap per turn (tokens)."""
    max_prompt_tokens: int = 2048
    """An episode whose prompt would exceed this is truncated."""
    temperature: float = 1.0
    """Sampling temperature during training rollouts."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    top_k: int = 0
    """Top-k sampling (0 disables)."""


@dataclass
class AlgorithmConfig:
    """The advantage estimator and its arguments."""

    name: str = "gigpo"
    """Registered algorithm: ``grpo``, ``rloo``, ``gigpo``, ..."""
    args: dict[str, Any] = field(default_factory=dict)
    """The algorithm's arguments (see its args dataclass); validated against it."""
    drop_zero_advantage_turns: bool = False
    """Leave turns with advantage exactly 0 out of the update (they carry no gradient for the policy term)."""


@dataclass
class OptimConfig:
    """Optimiser and update schedule."""

    lr: float = 1e-4
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    grad_clip: float = 1.0
    """Max global grad norm (0 disables)."""
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    """LR schedule over the RL iterations."""
    warmup_iterations: int = 0
    """Linear warm-up iterations."""
    num_epochs: int = 1
    """Passes over each iteration's batch."""
    num_minibatches: int = 4
    """Optimiser steps per epoch."""


@dataclass
class LossSettings:
    """The shared PPO-style loss (see ``agentgym.training.losses``)."""

    clip_ratio_low: float = 0.2
    """ε_low of the PPO clip."""
    clip_ratio_high: float = 0.2
    """ε_high of the PPO clip (0.28 = DAPO clip-higher)."""
    dual_clip_c: float | None = 3.0
    """Dual-clip bound for negative advantages (None disables)."""
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"] = (
        "token-mean")
    """How token losses are aggregated."""
    sequence_ratio: bool = False
    """GSPO sequence-level ratio."""
    kl_coef: float = 0.0
    """Weight of the KL to the frozen reference policy (0: no reference model)."""
    kl_type: Literal["k1", "k3"] = "k3"
    """KL estimator."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus."""


@dataclass
class SFTConfig:
    """Supervised warm start on the env's expert demonstrations."""

    enabled: bool = True
    """Run SFT before RL."""
    num_episodes: int = 64
    """Expert episodes (demo budget) to imitate."""
    num_epochs: int = 3
    """Passes over the demos."""
    lr: float = 1e-3
    """AdamW learning rate for SFT."""
    batch_size: int = 32
    """Turns per optimiser step."""
    seed_offset: int = 2_000_000
    """Demo seeds start here (disjoint from RL and eval seeds)."""


@dataclass
class EvalConfig:
    """Held-out evaluation before and after training."""

    num_episodes: int = 64
    """Episodes per evaluation."""
    seed_offset: int = 1_000_000
    """Eval seeds are seed_offset + i; training seeds are drawn below this, so they never overlap."""
    temperature: float = 0.0
    """Sampling temperature at evaluation (0 = greedy)."""
    every: int = 0
    """Also evaluate every N iterations (0: only before and after)."""


@dataclass
class TrainConfig:
    """A whole training run."""

    seed: int = 0
    """Seeds Python, NumPy and torch, and the task seeds."""
    iterations: int = 30
    """RL iterations (collect → estimate → update)."""
    checkpoint_every: int = 10
    """Save a resumable checkpoint every N iterations (0: only at the end)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    loss: LossSettings = field(default_factory=LossSettings)
    sft: SFTConfig = field(default_factory=SFTConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def validate(self) -> TrainConfig:
        """Cross-field checks; raises ``ConfigError`` naming the field to change."""
        from agentgym.training.algorithm import get_algorithm

        positive = {
            "iterations": self.iterations, "rollout.num_tasks": self.rollout.num_tasks,
            "rollout.group_size": self.rollout.group_size, "rollout.max_new_tokens": self.rollout.max_new_tokens,
            "optim.num_epochs": self.optim.num_epochs, "optim.num_minibatches": self.optim.num_minibatches,
            "eval.num_episodes": self.eval.num_episodes, "sft.batch_size": self.sft.batch_size,
        }
        for name, value in positive.items():
            if value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        if self.optim.lr <= 0:
            raise ConfigError(f"optim.lr must be > 0, got {self.optim.lr}")
        if not 0 <= self.loss.clip_ratio_low < 1 or self.loss.clip_ratio_high < 0:
            raise ConfigError("loss.clip_ratio_low must be in [0, 1) and loss.clip_ratio_high >= 0")
        if self.loss.dual_clip_c is not None and self.loss.dual_clip_c <= 1:
            raise ConfigError(f"loss.dual_clip_c must be > 1 (or null to disable), got {self.loss.dual_clip_c}")
        if self.rollout.temperature < 0 or self.eval.temperature < 0:
            raise ConfigError("rollout.temperature and eval.temperature must be >= 0")
        if self.rollout.group_size < 2 and self.algorithm.name in ("grpo", "rloo", "gigpo"):
            raise ConfigError(
                f"rollout.group_size must be >= 2 for {self.algorithm.name!r}: a group of one has no baseline"
            )
        get_algorithm(self.algorithm.name).make_args(self.algorithm.args)  # names the bad argument
        return self


# --- building typed configs from plain data ----------------------------------------------------


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def _coerce(value: Any, tp: Any, where: str) -> Any:
    origin = get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping of its fields, got {value!r}")
        return _build(tp, value, where)
    if origin in (Union, types.UnionType):
        options = get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{where}: {value!r} matches none of "
                          f"{', '.join(_type_name(o) for o in options)}")
    if origin is Literal:
        choices = get_args(tp)
        if value not in choices:
            raise ConfigError(f"{where} must be one of {', '.join(map(repr, choices))}; got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(get_args(tp)):
            raise ConfigError(f"{where} must be a list of {len(get_args(tp))} values, got {value!r}")
        return tuple(_coerce(v, t, f"{where}[{i}]") for i, (v, t) in enumerate(zip(value, get_args(tp))))
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping, got {value!r}")
        return dict(value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return value
    if tp is typing.Any:
        return value
    raise ConfigError(f"{where}: unsupported field type {tp!r}")  # pragma: no cover


def _build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    hints = get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    values = {}
    for key, value in data.items():
        where = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" Did you mean {f'{prefix}.' if prefix else ''}{close[0]}?" if close else ""
            raise ConfigError(f"unknown config field {where!r}.{hint} Valid here: {', '.join(names)}")
        values[key] = _coerce(value, hints[key], where)
    return cls(**values)


def config_from_dict(data: dict[str, Any]) -> TrainConfig:
    """Build and validate a ``TrainConfig`` from nested plain data (e.g. parsed YAML).

    Example:
        >>> cfg = config_from_dict({"iterations": 3, "rollout": {"group_size": 4}})
        >>> cfg.iterations, cfg.rollout.group_size, cfg.algorithm.name
        (3, 4, 'gigpo')
    """
    if not isinstance(data, dict):
        raise ConfigError(f"a config must be a mapping at the top level, got {type(data).__name__}")
    return _build(TrainConfig, data).validate()


def config_to_dict(cfg: TrainConfig) -> dict[str, Any]:
    """Plain nested data (tuples as lists), the inverse of ``config_from_dict``."""
    def plain(value: Any) -> Any:
        if isinstance(value, tuple):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, list):
            return [plain(v) for v in value]
        return value

    return plain(dataclasses.asdict(cfg))


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` strings to nested data; values are parsed as YAML scalars.

    Example:
        >>> apply_overrides({"rollout": {"group_size": 8}}, ["rollout.group_size=4", "algorithm.name=grpo"])
        {'rollout': {'group_size': 4}, 'algorithm': {'name': 'grpo'}}
        >>> apply_overrides({}, ["optim.lr=1e-3"])
        {'optim': {'lr': 0.001}}
    """
    result = yaml.safe_load(yaml.safe_dump(data)) or {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} must look like key.sub=value, e.g. rollout.group_size=4")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {item!r}: value is not valid YAML ({exc})") from None
        if isinstance(value, str):
            try:  # YAML 1.1 reads "1e-3" as a string; on the command line people mean the number
                value = float(value) if any(c in value for c in ".eE") else int(value)
            except ValueError:
                pass
        node = result
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part!r} is a value, not a section")
            node = child
        node[parts[-1]] = value
    return result


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Read a YAML preset (``None``: the embedded quickstart), apply overrides, validate."""
    if path is None:
        from agentgym.training.quickstart import QUICKSTART

        data: Any = QUICKSTART
    else:
        file = Path(path)
        if not file.is_file():
            presets = sorted(p.name for p in (Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))
            raise ConfigError(f"config file {str(file)!r} not found" + (
                f"; presets in configs/: {', '.join(presets)}" if presets else ""))
        try:
            data = yaml.safe_load(file.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{file} is not valid YAML: {exc}") from None
    return config_from_dict(apply_overrides(data, overrides or []))
