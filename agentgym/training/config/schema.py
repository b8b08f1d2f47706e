"""Training configuration: one typed config dataclass per component, and ``--set`` overrides.

``TrainConfig`` is the whole run. Every field has a default and a docstring; YAML presets in
``configs/`` are flat, complete files (``agentgym.training.config.loading.load_config`` reads them). Errors
name the field to fix (``rollout.group_size``) and suggest the nearest field name for typos. This
module imports no ML framework and nothing of the training package but the coercion it builds with.
"""

from __future__ import annotations

import importlib.util
import math
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, get_args

import yaml

from agentgym.backends.config import ModelConfig
from agentgym.core import HELD_OUT_SEED_START
from agentgym.errors import ConfigError
from agentgym.rollout.prompt import PromptSettings
from agentgym.training.config.coercion import to_plain, yaml_problem
from agentgym.training.config.plugin_settings import PluginSection
from agentgym.training.config.quickstart import QUICKSTART

AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
AGG_MODES: tuple[str, ...] = get_args(AggMode)
KlType = Literal["k1", "k2", "k3"]
KL_TYPES: tuple[str, ...] = get_args(KlType)


@dataclass(frozen=True)
class EnvConfig(PluginSection):
    """The environment the agent trains and is evaluated on; env-side plug-ins add their settings here
    (``agentgym.training.config.plugin_settings``; the built-ins': ``agentgym.training.api.env_settings``)."""

    SECTION: ClassVar[str] = "env"

    id: str = QUICKSTART["env"]["id"]
    """Registered env id (default: the quickstart's)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Env constructor arguments."""
    max_turns: int | None = None
    """Override the env spec's turn budget."""
    url: str | None = None
    """Use sessions on an env service at this URL instead of in-process envs."""
    token: str | None = None
    """Bearer token for ``url`` / ``urls``."""
    urls: tuple[str, ...] = ()
    """Several env services (a fleet): sessions go to the least-loaded one, and the episodes of a
    service that dies are replayed on another. Use either ``url`` or ``urls``."""
    timeout_s: float = 60.0
    """Per-request deadline for ``url``/``urls``: a service slower than this counts as dead (its
    episodes move to another service of the fleet)."""
    backend: Literal["local", "ray"] = "local"
    """Where in-process envs run when no ``url``/``urls`` is set: ``local`` in the trainer's process,
    ``ray`` in Ray actors (``pip install 'agentgym-rl[ray]'``)."""
    ray_address: str | None = None
    """For ``backend: ray``: the cluster to join (``ray.init(address=...)``); None starts or joins a
    local instance (``RAY_ADDRESS`` is honoured)."""
    ray_workers: int | None = None
    """For ``backend: ray``: env actors (each holds many envs); None: one per CPU of the cluster, at most
    16."""
    train_split: str | None = None
    """Train on the tasks of this named split (``agentgym envs --tasks ID`` lists an env's splits): the
    task sampler draws task indices below its size (below ``eval.seed_offset`` for a procedural split)
    and SFT demonstrations play its tasks from index 0 (round again when they outnumber them). None:
    tasks are seeds below ``eval.seed_offset``, which every env maps to its training tasks."""
    plugins: dict[str, Any] = field(default_factory=dict)
    """Plug-ins' settings, checked by their settings types; read as attributes (``cfg.env.<key>``)."""

    def __post_init__(self) -> None:
        if self.url and self.urls:
            raise ConfigError("env.url and env.urls are both set; list every service in env.urls and drop "
                              "env.url")
        for url in ([self.url] if self.url else []) + list(self.urls):
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise ConfigError(f"env.urls / env.url must be http:// or https:// URLs, got {url!r}")
        if len(set(self.urls)) != len(self.urls):
            raise ConfigError(f"env.urls lists a service twice: {list(self.urls)}")
        if not (isinstance(self.timeout_s, (int, float)) and 0 < self.timeout_s < math.inf):
            raise ConfigError(f"env.timeout_s must be a positive number of seconds, got {self.timeout_s!r}")
        if self.backend not in ("local", "ray"):
            raise ConfigError(f"env.backend must be 'local' or 'ray', got {self.backend!r}")
        if self.backend == "ray" and (self.url or self.urls):
            raise ConfigError("env.backend: ray runs envs in Ray actors; it cannot be combined with "
                              "env.url/env.urls (services are already remote): drop one of them")
        if self.ray_workers is not None and (isinstance(self.ray_workers, bool) or self.ray_workers < 1):
            raise ConfigError(f"env.ray_workers must be a positive integer or null, got {self.ray_workers!r}")
        self.check_plugins()


#: Most iterations asynchronous rollouts may run ahead (each holds a batch of episodes in memory).
MAX_STALENESS = 8


@dataclass(frozen=True)
class RolloutConfig(PromptSettings, PluginSection):
    """How episodes are collected: the prompt settings (``agentgym.rollout.prompt.PromptSettings``, shared
    with `agentgym eval`, which reads them back from the run's config.json), the fields below, and the
    settings task samplers add, each under the sampler's name."""

    SECTION: ClassVar[str] = "rollout"

    num_tasks: int = 8
    """B: tasks (seeds) per iteration."""
    group_size: int = 8
    """G: episodes per task (same seed), the group of group-relative estimators."""
    temperature: float = 1.0
    """Sampling temperature during training rollouts."""
    max_staleness: int = 0
    """Asynchronous rollouts: K >= 1 collects up to K iterations ahead while updates run, so a batch was
    sampled by weights at most K updates old (each token is importance-corrected against the log-probs
    of the weights that sampled it); 0 (the default) alternates, and is exactly synchronous training."""
    partial_rollouts: bool = False
    """Asynchronous rollouts on a copy of the weights: episodes in flight take the newest weights at their
    next turn (each turn records the version that sampled it), instead of at the next collection. A
    server generator always takes them in flight."""
    weight_sync_timeout_s: float = 300.0
    """Deadline of every weight sync to the generator; a sync past it ends the run with
    ``WeightSyncTimeout`` instead of hanging."""
    require_tool_calls: bool = True
    """On an env with tools, stop the run with an error when an iteration's rollouts make no tool call
    at all (a format or prompt problem that would otherwise train on nothing)."""
    task_sampler: str = "uniform"
    """Which training tasks each iteration collects: a registered task sampler (the built-ins and their
    settings: ``agentgym.training.run.task_sampling``); the default draws seeds uniformly below
    ``eval.seed_offset``."""
    plugins: dict[str, Any] = field(default_factory=dict)
    """Task samplers' settings, each under the sampler's name, checked by the settings type it registers
    (``register_task_sampler(..., settings=...)``); read as attributes (``cfg.rollout.<name>``)."""

    def __post_init__(self) -> None:
        if isinstance(self.max_staleness, bool) or not isinstance(self.max_staleness, int) \
                or not 0 <= self.max_staleness <= MAX_STALENESS:
            raise ConfigError(f"RolloutConfig.max_staleness must be an integer in 0..{MAX_STALENESS} (0: "
                              f"synchronous), got {self.max_staleness!r}")
        if not 0 < self.weight_sync_timeout_s < math.inf:
            raise ConfigError(f"RolloutConfig.weight_sync_timeout_s must be a positive number of seconds, "
                              f"got {self.weight_sync_timeout_s!r}")
        if self.partial_rollouts and not self.max_staleness:
            raise ConfigError("RolloutConfig.partial_rollouts is for asynchronous rollouts: set "
                              "rollout.max_staleness to 1 or more, or drop partial_rollouts")
        self.check_plugins()


@dataclass(frozen=True)
class AlgorithmConfig:
    """The algorithm, its arguments and the rollout-hook options added to it."""

    name: str = QUICKSTART["algorithm"]["name"]
    """Registered algorithm (``agentgym algorithms`` lists them; default: the quickstart's)."""
    args: dict[str, Any] = field(default_factory=dict)
    """The algorithm's arguments (see its args dataclass); validated against it."""
    hooks: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Extra rollout hooks usable with any algorithm, by registered name → arguments."""
    drop_zero_advantage_turns: bool = False
    """Leave turns with advantage exactly 0 out of the update (they carry no gradient for the policy term)."""


@dataclass(frozen=True)
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
    """Passes over each update phase's rows."""
    num_minibatches: int = 4
    """Optimiser steps per epoch."""
    micro_batch_tokens: int | None = None
    """Gradient accumulation: each process runs its share of a minibatch in forward/backward passes of
    at most this many padded tokens (rows × longest row); the update is the same as in one pass.
    None: one pass per minibatch."""
    response_logits: bool = False
    """Compute the update's logits at the trained (response) positions only, not at every prompt position:
    with a large vocabulary and long prompts (a real model on a tool task) it cuts the update's time and
    memory (``benchmarks/response_logits.py``: 39 -> 26 s, 17.8 -> 13.7 GB on SmolLM2). The values are the
    same up to float rounding, so a run is not bit-identical to one without it. Applies to the SFT warm
    start's passes too."""
    old_logprobs_from_update: bool = False
    """Take the PPO ratio's old log-probs (and the importance weights of asynchronous or engine-sampled
    batches) from the update's own forward pass, detached, instead of a separate no-grad pass over the batch
    before it: with one optimiser step per update phase (``num_epochs: 1``, ``num_minibatches: 1``) both see
    the same weights, so the values agree up to float rounding (the model in training mode: exactly so
    without dropout) and one forward pass of the batch is saved. An update plan that reads log-probs after
    each phase still gets the separate pass."""
    share_prefixes: bool = False
    """Compute the prompt that a group's rows share (and the history an episode's later turns repeat) once per
    forward pass instead of once per row: rows are sorted so that common prefixes are neighbours and cut into
    segments whose prefix runs once, every row continuing its key/value cache
    (``agentgym.training.engine.prefix``). Values and gradients are the plain pass's up to float rounding; in
    one process, without gradient checkpointing. Applies to the SFT warm start's passes too (demonstrations
    share the env's instructions and their episodes' histories)."""
    mixed_precision: Literal["no", "bf16"] = "no"
    """``bf16``: forward passes under bfloat16 autocast with float32 weights and optimiser (through
    accelerate); ``model.dtype: bfloat16`` instead keeps the weights themselves in bfloat16."""


@dataclass(frozen=True)
class LossConfig(PluginSection):
    """The shared loss: the policy term, the KL and entropy terms, any other registered loss terms, and the
    settings policy losses add (``register_policy_loss(..., settings=...)``; the built-ins':
    ``agentgym.training.api.loss_registry``).

    Example:
        >>> LossConfig(clip_ratio_high=0.28).clip_ratio_high
        0.28
        >>> LossConfig(loss_agg_mode="token-sum")
        Traceback (most recent call last):
        ...
        agentgym.errors.ConfigError: LossConfig.loss_agg_mode must be one of ['token-mean', \
'seq-mean-token-mean', 'seq-mean-token-sum', 'seq-mean-token-sum-norm'], got 'token-sum'
    """

    SECTION: ClassVar[str] = "loss"
    RETIRED_FIELDS: ClassVar[dict[str, str]] = {
        "sequence_ratio": "GSPO's sequence ratio is its policy loss; set loss.loss_mode=gspo"}

    loss_mode: str | None = None
    """Registered policy loss (``agentgym algorithms`` lists them); None uses the algorithm's."""
    clip_ratio_low: float = 0.2
    """PPO ε_low: the ratio is clipped below at ``1 - clip_ratio_low``. GSPO's paper uses 3e-4."""
    clip_ratio_high: float = 0.2
    """PPO ε_high: clipped above at ``1 + clip_ratio_high``; DAPO's clip-higher uses 0.28, GSPO 4e-4."""
    dual_clip_c: float | None = 3.0
    """Dual-clip bound c > 1 for negative advantages (loss ≤ -A·c); None disables dual clip."""
    loss_agg_mode: AggMode = "token-mean"
    """How per-token losses become a scalar (``agentgym.training.engine.losses.aggregate``). Dr.GRPO:
    ``seq-mean-token-sum-norm``; original GRPO and GSPO: ``seq-mean-token-mean``; DAPO and verl's
    default: ``token-mean``."""
    loss_agg_norm_tokens: int | None = None
    """Constant normaliser L of ``seq-mean-token-sum-norm`` in tokens (Dr.GRPO: the max response
    length); None uses the batch's padded width, which changes with the batch."""
    kl_coef: float = 0.0
    """β of the ``kl`` term (KL to the frozen post-SFT reference policy); 0 turns it off and no
    reference model is kept."""
    kl_type: KlType = "k3"
    """KL estimator of the ``kl`` term: ``k1`` (log ratio), ``k2`` (half squared log ratio) or ``k3``
    (verl's ``low_var_kl``)."""
    entropy_coef: float = 0.0
    """Weight of the ``entropy`` term (an entropy bonus subtracted from the loss); 0 turns it off."""
    terms: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Other registered loss terms by name → arguments (``agentgym.training.api.terms``)."""
    skip_forced_tokens: bool = True
    """Under a decoding constraint (``rollout.constraint``), leave the response tokens it forced (the
    only token allowed there) out of every loss term: the policy chose nothing at them, so they carry no
    policy gradient of the constrained policy. False trains on them too, which moves the unconstrained
    distribution at every copied character (on code-math's drill 83% of the tokens) and, measured on
    search-qa, learns less (benchmarks/README.md)."""
    tis_cap: float | None = None
    """Truncated importance sampling for the sampler/trainer mismatch (e.g. vLLM's log-probs against
    the trainer's): each response token's policy loss is weighted by min(π_old / π_sampler, tis_cap)
    (``agentgym.training.engine.offpolicy``); None: no weighting (stale asynchronous batches are still
    corrected, with cap 2)."""
    plugins: dict[str, Any] = field(default_factory=dict)
    """Policy losses' settings, written as keys of ``loss`` and checked by the settings type each loss
    registers; read as attributes (``cfg.loss.<key>``)."""

    def __post_init__(self) -> None:
        if self.loss_agg_mode not in AGG_MODES:
            raise ConfigError(
                f"LossConfig.loss_agg_mode must be one of {list(AGG_MODES)}, got {self.loss_agg_mode!r}"
            )
        if self.kl_type not in KL_TYPES:
            raise ConfigError(f"LossConfig.kl_type must be one of {list(KL_TYPES)}, got {self.kl_type!r}")
        if not 0.0 <= self.clip_ratio_low < 1.0:
            raise ConfigError(f"LossConfig.clip_ratio_low must be in [0, 1), got {self.clip_ratio_low}")
        if not 0.0 <= self.clip_ratio_high < math.inf:
            raise ConfigError(f"LossConfig.clip_ratio_high must be >= 0, got {self.clip_ratio_high}")
        if self.dual_clip_c is not None and not 1.0 < self.dual_clip_c < math.inf:
            raise ConfigError(
                f"LossConfig.dual_clip_c must be > 1 (or None to disable dual clip), got {self.dual_clip_c}"
            )
        if not 0.0 <= self.kl_coef < math.inf:
            raise ConfigError(f"LossConfig.kl_coef must be >= 0, got {self.kl_coef}")
        if not math.isfinite(self.entropy_coef):
            raise ConfigError(f"LossConfig.entropy_coef must be finite, got {self.entropy_coef}")
        if self.loss_mode is not None and (not isinstance(self.loss_mode, str) or not self.loss_mode):
            raise ConfigError(f"LossConfig.loss_mode must name a registered policy loss, "
                              f"got {self.loss_mode!r}")
        norm = self.loss_agg_norm_tokens
        if norm is not None and (isinstance(norm, bool) or not isinstance(norm, int) or norm < 1):
            raise ConfigError(f"LossConfig.loss_agg_norm_tokens must be a positive integer or None, "
                              f"got {norm!r}")
        if self.tis_cap is not None and not 0 < self.tis_cap < math.inf:
            raise ConfigError(f"LossConfig.tis_cap must be a positive number (or None), got {self.tis_cap!r}")
        if "kl" in self.terms or "entropy" in self.terms:
            raise ConfigError("LossConfig.terms: the kl and entropy terms are set by kl_coef/kl_type and "
                              "entropy_coef, not under terms")
        self.check_plugins()


@dataclass(frozen=True)
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
    all_layers: bool = False
    """Train every weight during SFT even where ``model.train_top_layers`` limits what RL trains: the warm
    start is a few steps, and an action format is slow to learn in the top layers alone (the calculator
    preset on SmolLM2: 3% held-out after SFT with the top 6 of 30 layers, 75-78% with all of them)."""
    from_run: str | None = None
    """A run folder to take the warm start from instead of making one: its post-SFT weights, evaluations and
    random state, so this run's RL goes as that run's would have (``agentgym.training.run.warm_start``). Make
    one with ``agentgym train CONFIG --out DIR --warm-start-only``; the configs must agree on every field the
    warm start reads (only the algorithm, its loss, the RL optimiser and the training rollouts may differ)."""


@dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation before and after training."""

    num_episodes: int = 64
    """Episodes per evaluation."""
    seed_offset: int = HELD_OUT_SEED_START
    """Eval seeds are seed_offset + i; training seeds are drawn below this, so they never overlap."""
    temperature: float = 0.0
    """Sampling temperature at evaluation (0 = greedy)."""
    every: int = 0
    """Also evaluate every N iterations (0: only before and after)."""
    before_sft: bool = True
    """Also evaluate before the SFT warm start (the untrained model's success, in ``report.json``); false
    skips it, which saves minutes with a real model whose untrained replies run to the token limit."""
    split: str | None = None
    """Evaluate on tasks ``0..`` of this named split: ``num_episodes`` of them, or all of a smaller split.
    None: seeds from ``seed_offset``, which every env maps to its held-out tasks."""


#: The extra that installs the trackers (``pyproject.toml``).
TRACKING_INSTALL = "pip install 'agentgym-rl[tracking]'"
#: Characters a W&B project name cannot hold (W&B refuses them).
_PROJECT_FORBIDDEN = re.compile(r"[/\\#?%:]")


def _installed(*modules: str) -> bool:
    """Whether every module can be imported, found without importing it (a config check loads no tracker)."""
    return all(importlib.util.find_spec(module) is not None for module in modules)


@dataclass(frozen=True)
class TrackingConfig:
    """Where each iteration's metrics go besides ``metrics.jsonl``: TensorBoard, MLflow, W&B.

    A tracker gets the run's config once (as its parameters), each iteration's metrics at the iteration
    as step, and the report's held-out success before and after at the end; a resumed run continues the
    tracker's run (its id is kept in the run folder's ``tracking.json``). Only observes the run, so a
    resumed run may change it.

    Example:
        >>> TrackingConfig(mlflow_uri="sqlite:///shared.db")
        Traceback (most recent call last):
        ...
        agentgym.errors.ConfigError: TrackingConfig.mlflow_uri is set but mlflow is false; set \
tracking.mlflow=true to log there, or drop tracking.mlflow_uri
    """

    tensorboard: bool = True
    """TensorBoard events in the run folder's ``tensorboard/``, when TensorBoard is installed (the
    ``train`` extra); without it only ``metrics.jsonl`` is written."""
    mlflow: bool = False
    """Log to an MLflow run (``pip install 'agentgym-rl[tracking]'``); by default into a SQLite store in
    the run folder (``mlruns/mlflow.db``): ``mlflow ui --backend-store-uri sqlite:///RUN/mlruns/mlflow.db``."""
    mlflow_uri: str | None = None
    """MLflow tracking URI to log to instead of the run folder's store: a database
    (``sqlite:///path.db``) or a tracking server (``http://host:5000``)."""
    wandb: bool = False
    """Log to a Weights & Biases run in offline mode (``pip install 'agentgym-rl[tracking]'``): training
    never touches the network; the run is written under the run folder's ``wandb/`` and uploaded, when
    wanted, with ``wandb sync RUN/wandb/offline-run-*``."""
    project: str = "agentgym"
    """MLflow experiment and W&B project the run is logged under."""
    run_name: str | None = None
    """The tracker run's display name; None: the run folder's name."""

    def __post_init__(self) -> None:
        if not isinstance(self.project, str) or not self.project.strip() \
                or _PROJECT_FORBIDDEN.search(self.project):
            raise ConfigError(f"TrackingConfig.project must be a name without / \\ # ? % : (W&B refuses "
                              f"them), got {self.project!r}")
        if self.run_name is not None and (not isinstance(self.run_name, str) or not self.run_name.strip()):
            raise ConfigError(f"TrackingConfig.run_name must be a non-empty name or null (the run folder's "
                              f"name), got {self.run_name!r}")
        if self.mlflow_uri is not None:
            if not isinstance(self.mlflow_uri, str) or not self.mlflow_uri.strip():
                raise ConfigError(f"TrackingConfig.mlflow_uri must be an MLflow tracking URI or null (the "
                                  f"run folder's store), got {self.mlflow_uri!r}")
            if not self.mlflow:
                raise ConfigError("TrackingConfig.mlflow_uri is set but mlflow is false; set "
                                  "tracking.mlflow=true to log there, or drop tracking.mlflow_uri")
        if self.mlflow and not _installed("mlflow"):
            raise ConfigError(f"TrackingConfig.mlflow is true but MLflow is not installed: "
                              f"{TRACKING_INSTALL} (or set tracking.mlflow=false)")
        if self.mlflow and self.mlflow_uri is None and not _installed("sqlalchemy", "alembic"):
            raise ConfigError(f"TrackingConfig.mlflow: the run folder's MLflow store is a SQLite database, "
                              f"which needs sqlalchemy and alembic: {TRACKING_INSTALL} (or set "
                              f"tracking.mlflow_uri to a tracking server)")
        if self.wandb and not _installed("wandb"):
            raise ConfigError(f"TrackingConfig.wandb is true but wandb is not installed: {TRACKING_INSTALL} "
                              f"(or set tracking.wandb=false)")


@dataclass(frozen=True)
class TrainConfig:
    """A whole training run."""

    seed: int = 0
    """Seeds Python, NumPy and torch, the tiny model's initialisation and the task seeds."""
    iterations: int = 30
    """RL iterations (collect → estimate → update)."""
    checkpoint_every: int = 10
    """Save a resumable checkpoint every N iterations (0: only at the end)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model (``agentgym.backends.config.ModelConfig``)."""
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    """Experiment trackers the metrics also go to (``TrackingConfig``)."""

    def validate(self) -> TrainConfig:
        """Field ranges that no single field's type can express; raises ``ConfigError`` naming the field.
        (``agentgym.training.config.loading.check_config`` adds the checks that need the registries.)"""
        positive = {
            "iterations": self.iterations, "rollout.num_tasks": self.rollout.num_tasks,
            "rollout.group_size": self.rollout.group_size,
            "rollout.max_new_tokens": self.rollout.max_new_tokens,
            "optim.num_epochs": self.optim.num_epochs, "optim.num_minibatches": self.optim.num_minibatches,
            "eval.num_episodes": self.eval.num_episodes, "sft.batch_size": self.sft.batch_size,
        }
        for name, value in positive.items():
            if value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        if self.optim.micro_batch_tokens is not None and self.optim.micro_batch_tokens < 1:
            raise ConfigError(f"optim.micro_batch_tokens must be >= 1 or null, "
                              f"got {self.optim.micro_batch_tokens}")
        if self.optim.lr <= 0:
            raise ConfigError(f"optim.lr must be > 0, got {self.optim.lr}")
        steps = (self.optim.num_epochs, self.optim.num_minibatches)
        if self.optim.old_logprobs_from_update and steps != (1, 1):
            raise ConfigError(f"optim.old_logprobs_from_update needs one optimiser step per update phase "
                              f"(optim.num_epochs: 1, optim.num_minibatches: 1), got {self.optim.num_epochs} "
                              f"and {self.optim.num_minibatches}: later steps see other weights than the "
                              f"old log-probs' (set it to false, or both to 1)")
        if self.optim.share_prefixes and self.model.gradient_checkpointing:
            raise ConfigError("optim.share_prefixes continues each prefix's key/value cache, which gradient "
                              "checkpointing turns off: set one of optim.share_prefixes and "
                              "model.gradient_checkpointing to false")
        if self.rollout.temperature < 0 or self.eval.temperature < 0:
            raise ConfigError("rollout.temperature and eval.temperature must be >= 0")
        self._check_splits()
        return self

    def _check_splits(self) -> None:
        """Named splits route seed ranges to tasks (``RoutedTaskEnv``): training seeds below
        ``eval.seed_offset``, held-out seeds from it, demonstrations from ``sft.seed_offset`` above it."""
        train, held_out = self.env.train_split, self.eval.split
        for name, split in (("env.train_split", train), ("eval.split", held_out)):
            if split is not None and (not isinstance(split, str) or not split.strip()):
                raise ConfigError(f"{name} must name a task split (`agentgym envs --tasks {self.env.id}`), "
                                  f"got {split!r}")
        if train is None and held_out is None:
            return
        if train is not None and train == held_out:
            raise ConfigError(f"env.train_split and eval.split are both {train!r}: the held-out evaluation "
                              f"would score training tasks; pick another eval.split")
        if self.env.backend == "ray":
            raise ConfigError("env.train_split / eval.split wrap envs in the trainer's process; they cannot "
                              "be combined with env.backend: ray")
        if self.sft.seed_offset <= self.eval.seed_offset:
            raise ConfigError(f"with named splits, demonstration seeds (sft.seed_offset="
                              f"{self.sft.seed_offset}) must start above the held-out ones (eval.seed_offset="
                              f"{self.eval.seed_offset}); raise sft.seed_offset")


def config_to_dict(cfg: TrainConfig) -> dict[str, Any]:
    """Plain nested data (tuples as lists), the inverse of ``config_from_dict``."""
    return to_plain(cfg)


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
            raise ConfigError(f"override {item!r}: value is not valid YAML ({yaml_problem(exc)})") from None
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
