"""The algorithm plug-in: ``Algorithm``, ``AlgorithmNeeds``, ``register_algorithm``, ``get_algorithm``.

An algorithm is a name plus any of six plug-in points; the trainer wires them and never tests an
algorithm's name:

1. ``estimator(groups, args) -> float64[num_turns]``: per-turn advantages, a pure function of the
   records (required);
2. ``hooks(args) -> RolloutHooks``: act during collection (sampling parameters, forks after a turn,
   annotate or filter groups after collection);
3. a **scorer**: declared with ``needs.scorer``; the policy must implement ``Scorer``;
4. ``update_plan(args) -> UpdatePlan``: the sequence of update phases within an iteration;
5. ``policy_loss``: the registered policy loss it uses unless the config picks another;
6. ``loss_terms``: registered loss terms (name → arguments) added to the loss.

It also declares what it needs (``AlgorithmNeeds``) and its minimum group size, so a config that
cannot work fails at start-up. Built-ins live in ``agentgym.trainers``; third-party packages
register through the entry-point group ``agentgym.trainers``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from agentgym.plugins import PluginRegistry
from agentgym.rollout.hooks import RolloutHooks
from agentgym.rollout.records import EpisodeGroup
from agentgym.training.api.plan import UpdatePlan
from agentgym.training.config.coercion import build

ENTRY_POINT_GROUP = "agentgym.trainers"


class AdvantageEstimator(Protocol):
    """Contract of every estimator.

    Args:
        groups: the batch; each group's trajectories share a task and seed. The loop hands a ``Batch``
            (``agentgym.training.api.turn_table``), which carries the ``TurnTable`` it built once for the
            iteration and passes to the update too; ``TurnTable.of(groups)`` reads it (and builds one for a
            plain list of groups, so an estimator runs on hand-built groups as well).
        args: the algorithm's argument dataclass.

    Returns:
        float64 array of shape (num_turns,): one advantage per turn, in the order of
        ``[turn for g in groups for t in g.trajectories for turn in t.turns]``. The trainer
        broadcasts it to that turn's response tokens. Pure function of the records: no model, no env.
    """

    def __call__(self, groups: Sequence[EpisodeGroup], args: Any) -> np.ndarray: ...


@dataclass(frozen=True)
class AlgorithmNeeds:
    """What an algorithm needs from the backend and the env; checked before a run starts."""

    entropies: bool = False
    """Per-token entropies of the sampling distribution in ``Turn.extras["entropies"]``."""
    top_logprobs: int = 0
    """The k most likely log-probs per generated token in ``Turn.extras["top_logprobs"]`` (0: none)."""
    answer: bool = False
    """The env's privileged ``info["answer"]`` (``Trajectory.answer``)."""
    scorer: bool = False
    """Teacher-forced log-probs from the policy (the backend must be an
    ``agentgym.rollout.policy.Scorer``)."""
    forks: bool = False
    """Forked episodes (rollout hooks that branch): the env must be forkable (an env whose reset info says
    ``forkable: false``, such as a harness, is not)."""


@dataclass(frozen=True)
class Algorithm:
    """A registered algorithm: an estimator plus optional plug-ins (see the module docstring)."""

    name: str
    """Registry key, config value and metric prefix (lowercase paper acronym)."""
    estimator: AdvantageEstimator
    """Per-turn advantages from the records."""
    args_type: type
    """Dataclass of the algorithm's arguments; every field has a default and a docstring."""
    description: str = ""
    """One line for listings."""
    hooks: Callable[[Any], RolloutHooks] | None = None
    """Builds the algorithm's rollout hooks from its arguments (once per run)."""
    update_plan: Callable[[Any], UpdatePlan] | None = None
    """Builds the update plan from its arguments; None: one phase with every row."""
    policy_loss: str = "ppo_clip"
    """Registered policy loss used unless ``loss.loss_mode`` names another."""
    loss_terms: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Registered loss terms (name → arguments) the algorithm adds; ``loss.terms`` may override them."""
    needs: AlgorithmNeeds | Callable[[Any], AlgorithmNeeds] = AlgorithmNeeds()
    """What it needs from the backend and the env: fixed, or derived from its arguments (ARPO's top-k
    log-probs are as many as ``args.top_logprobs`` asks for). Read it through ``needs_for``."""
    min_group_size: int = 2
    """Smallest ``rollout.group_size`` it can work with (group-relative baselines need 2)."""

    def needs_for(self, args: Any) -> AlgorithmNeeds:
        """What the algorithm needs with these arguments."""
        return self.needs(args) if callable(self.needs) else self.needs

    def make_args(self, values: Mapping[str, Any] | None = None, where: str = "algorithm.args") -> Any:
        """Build validated arguments; every error names the config path (``algorithm.args.gamma``)."""
        return build(self.args_type, dict(values or {}), where)


ALGORITHMS: PluginRegistry[Algorithm] = PluginRegistry("algorithm", "agentgym.trainers", ENTRY_POINT_GROUP)


def register_algorithm(name: str, estimator: AdvantageEstimator, args_type: type, *, description: str = "",
                       hooks: Callable[[Any], RolloutHooks] | None = None,
                       update_plan: Callable[[Any], UpdatePlan] | None = None, policy_loss: str = "ppo_clip",
                       loss_terms: Mapping[str, Mapping[str, Any]] | None = None,
                       needs: AlgorithmNeeds | Callable[[Any], AlgorithmNeeds] = AlgorithmNeeds(),
                       min_group_size: int = 2,
                       override: bool = False) -> Algorithm:
    """Register an algorithm under ``name`` (see ``Algorithm`` for the fields).

    Raises:
        RegistryError: ``name`` is taken and ``override`` is False.

    Example:
        >>> from dataclasses import dataclass
        >>> @dataclass(frozen=True)
        ... class NoArgs:
        ...     pass
        >>> def zeros(groups, args):
        ...     return np.zeros(sum(len(t.turns) for g in groups for t in g.trajectories))
        >>> algo = register_algorithm("doc_zeros", zeros, NoArgs, description="all-zero advantages")
        >>> get_algorithm("doc_zeros") is algo
        True
        >>> ALGORITHMS.unregister("doc_zeros")  # keep the example out of every later listing
    """
    algorithm = Algorithm(name, estimator, args_type, description, hooks, update_plan, policy_loss,
                          dict(loss_terms or {}), needs, min_group_size)
    return ALGORITHMS.register(name, algorithm, override=override)


def get_algorithm(name: str) -> Algorithm:
    """Look up an algorithm; unknown names raise with suggestions and the registered names."""
    return ALGORITHMS.get(name)


def list_algorithms() -> list[Algorithm]:
    """Every registered algorithm, sorted by name."""
    return [ALGORITHMS.get(name) for name in ALGORITHMS.names()]
