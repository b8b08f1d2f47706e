"""``PluginSet``: an algorithm's plug-ins built for one run from the config, and the start-up checks of its
needs.

The plug-in set is everything that makes a run's algorithm what it is — estimator and arguments,
rollout hooks (the algorithm's and the options'), update plan, policy loss and loss terms — built
once, before any model or folder exists, so that a config that cannot work fails at start-up with a
message naming the field to change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from agentgym.errors import ConfigError
from agentgym.rollout.hooks import HookChain, RolloutHooks
from agentgym.rollout.policy import SamplingParams, Scorer, capability
from agentgym.training.api.algorithm import Algorithm, AlgorithmNeeds, get_algorithm
from agentgym.training.api.loss_registry import POLICY_LOSSES, PolicyLoss, get_policy_loss
from agentgym.training.api.options import get_hook_option
from agentgym.training.api.plan import UpdatePlan
from agentgym.training.api.terms import EntropyArgs, EntropyTerm, KLArgs, KLTerm, LossTerm, get_loss_term
from agentgym.training.config.loading import SETTINGS_TYPES, register_config_check

if TYPE_CHECKING:
    from agentgym.training.config.schema import TrainConfig


@dataclass
class PluginSet:
    """One run's algorithm, built from the config (``PluginSet.from_config``)."""

    algorithm: Algorithm
    """The registered algorithm."""
    args: Any
    """Its validated arguments."""
    hooks: RolloutHooks
    """The algorithm's rollout hooks followed by the options' (a ``HookChain``)."""
    plan: UpdatePlan
    """The update plan."""
    policy_loss_name: str
    """The registered policy loss in use (``policy_loss`` is its function)."""
    terms: dict[str, LossTerm]
    """The loss terms in use, by name."""

    @classmethod
    def from_config(cls, cfg: TrainConfig) -> PluginSet:
        """Build (and so validate) every plug-in the config names.

        Raises:
            RegistryError: an unknown algorithm, policy loss, loss term or hook option (with suggestions).
            ConfigError: bad arguments (naming ``algorithm.args.<field>`` etc.) or a group too small.
        """
        algorithm = get_algorithm(cfg.algorithm.name)
        args = algorithm.make_args(cfg.algorithm.args)
        if cfg.rollout.group_size < algorithm.min_group_size:
            raise ConfigError(f"rollout.group_size must be >= {algorithm.min_group_size} for "
                              f"{algorithm.name!r}: got {cfg.rollout.group_size} (a group of one has no "
                              "baseline)")
        hooks: list[RolloutHooks] = [algorithm.hooks(args)] if algorithm.hooks is not None else []
        hooks += [get_hook_option(name).build(values) for name, values in cfg.algorithm.hooks.items()]
        plan = algorithm.update_plan(args) if algorithm.update_plan is not None else UpdatePlan()
        loss_name = cfg.loss.loss_mode or algorithm.policy_loss
        POLICY_LOSSES.get(loss_name)  # an unknown name fails here, without importing the (torch) loss
        terms: dict[str, LossTerm] = {}
        if cfg.loss.kl_coef > 0:
            terms["kl"] = KLTerm(KLArgs(cfg.loss.kl_coef, cfg.loss.kl_type))
        if cfg.loss.entropy_coef != 0:
            terms["entropy"] = EntropyTerm(EntropyArgs(cfg.loss.entropy_coef))
        chosen: dict[str, Mapping[str, Any]] = {**algorithm.loss_terms, **cfg.loss.terms}
        for name, values in chosen.items():
            terms[name] = get_loss_term(name).build(values)
        return cls(algorithm, args, HookChain(hooks), plan, loss_name, terms)

    @property
    def policy_loss(self) -> PolicyLoss:
        """The policy loss function (a built-in's once the update engine, which defines it, is imported)."""
        return get_policy_loss(self.policy_loss_name)

    @property
    def needs_reference(self) -> bool:
        """Some loss term reads reference log-probs (keep a frozen reference policy)."""
        return any(term.needs_reference for term in self.terms.values())

    @property
    def needs_entropy(self) -> bool:
        """Some loss term reads the training forward pass's entropies."""
        return any(term.needs_entropy for term in self.terms.values())

    @property
    def needs(self) -> AlgorithmNeeds:
        """What the algorithm needs with this run's arguments."""
        return self.algorithm.needs_for(self.args)

    def sampling(self, params: SamplingParams) -> SamplingParams:
        """The sampling parameters with what the algorithm needs from the sampler switched on."""
        needs = self.needs
        if needs.entropies and not params.return_entropy:
            params = replace(params, return_entropy=True)
        if needs.top_logprobs > params.num_top_logprobs:
            params = replace(params, num_top_logprobs=needs.top_logprobs)
        return params

    def check_needs(self, policy: Any, env_id: str, reset_info: Mapping[str, Any]) -> None:
        """Fail before training when the backend or the env lacks what the algorithm needs.

        Args:
            policy: the run's policy (its capabilities are checked).
            env_id: the env's id, for messages.
            reset_info: the ``info`` of one reset of the run's env.

        Raises:
            ConfigError: naming the missing capability and what to change.
        """
        needs, name = self.needs, self.algorithm.name
        if needs.scorer and not isinstance(policy, Scorer):
            raise ConfigError(f"{name!r} needs teacher-forced scoring (a Scorer), which the "
                              f"{type(policy).__name__} backend does not offer; "
                              "use model.backend=transformers")
        if needs.entropies and not capability(policy, "supports_entropies"):
            raise ConfigError(f"{name!r} needs per-token entropies, which the {type(policy).__name__} "
                              "backend does not return")
        limit = capability(policy, "max_top_logprobs")
        if needs.top_logprobs and limit is not None and limit < needs.top_logprobs:
            raise ConfigError(f"{name!r} needs the top {needs.top_logprobs} log-probs per token; the "
                              f"{type(policy).__name__} backend returns at most {limit}")
        if needs.forks and reset_info.get("forkable") is False:
            raise ConfigError(f"{name!r} branches episodes, and {env_id!r} episodes cannot be forked (a "
                              "harness's agent cannot be copied mid-run); pick an algorithm that does not "
                              "fork (grpo, gigpo, rloo, dapo, gspo, seeupo)")
        if needs.answer and "answer" not in reset_info:
            raise ConfigError(f"{name!r} needs the env's privileged info['answer'], which {env_id!r} does "
                              "not provide; pick an env with ground-truth answers (e.g. search-qa-v0)")


# The config checks a run's plug-ins and states an algorithm's defaults through these (the config is below
# the algorithm API and names no plug-in).
register_config_check(PluginSet.from_config)
SETTINGS_TYPES["algorithm.args"] = lambda name: get_algorithm(name).args_type
