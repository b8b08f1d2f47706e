"""Rollout hooks: how an algorithm acts during collection (``RolloutHooks``, ``Fork``, ``EpisodeView``).

An algorithm (or an option such as DAPO's dynamic sampling) adjusts collection only through these
typed hooks; the collector never learns which algorithm it serves. Every hook is a no-op by default:

- ``sampling(params)`` adjusts the sampling parameters (e.g. ask the backend for entropies or top-k
  log-probs);
- ``before_collect(num_groups)`` resets per-batch state (ARPO's initial entropies);
- ``after_turn(episodes, context)`` looks at every episode after a turn and returns ``Fork``
  requests, which the collector performs (an env fork, a copied conversation and turn prefix, the
  branch kept in its group with ``parent_id``/``fork_turn`` set);
- ``after_collect(groups, context)`` annotates or filters the finished groups (IGPO's scores,
  DAPO's filter); ``max_extra_rounds`` lets the training loop collect more tasks when groups were
  filtered out, up to that many extra collection rounds;
- ``metrics()`` reports what the hook did in the iteration's collection, all of its rounds
  (``section/name`` keys); the training loop reads it once, after the last round.

Several hooks compose with ``HookChain``: sampling adjustments apply in order, forks concatenate,
filters apply in order, metrics merge.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentgym.rollout.policy import ChatTokenizer, SamplingParams, Scorer
from agentgym.rollout.records import EpisodeGroup, Turn


@dataclass(frozen=True)
class EpisodeView:
    """What a hook sees of one episode during collection (read-only)."""

    trajectory_id: str
    """Unique within the batch; the id its ``Trajectory`` will carry."""
    group_index: int
    """Index of the episode's group in this collection (0-based)."""
    turns: tuple[Turn, ...]
    """The turns so far (a fork's copied prefix included)."""
    info: Mapping[str, Any]
    """The env's latest ``info``, privileged keys (``answer``) included: hooks may read them, the
    policy never sees them."""
    over: bool
    """The episode has ended (terminated, truncated, or stopped by the prompt budget)."""
    parent_id: str | None = None
    """For a fork: the trajectory it was forked from."""
    fork_turn: int | None = None
    """For a fork: how many turns it shares with its parent."""


@dataclass(frozen=True)
class Fork:
    """A request to the collector to continue one task along one more future.

    With ``source_id``, the live episode of that id is forked right after its latest turn (the env by
    ``fork()``: snapshot/restore or deterministic replay, also over HTTP). Without it, a fresh episode
    of the group's task starts from the reset (a "top-up").
    """

    group_index: int
    """The group the new episode joins."""
    source_id: str | None = None
    """Trajectory id of the live episode to fork; None starts a fresh episode of the group's task."""


@dataclass(frozen=True)
class CollectContext:
    """What hooks may use besides the episodes: the tokenizer, the scorer (when the policy is one)."""

    tokenizer: ChatTokenizer
    """Renders and decodes token ids (e.g. to encode an answer for scoring)."""
    scorer: Scorer | None = None
    """Teacher-forced log-probs with the current weights; None when the policy cannot score."""
    iteration: int = 0
    """The training iteration being collected (0 outside training)."""


class RolloutHooks:
    """Base class of rollout hooks; every method is a no-op. Subclass and override what you need.

    Example (a hook that asks for entropies and drops groups without a success):
        >>> class KeepSolved(RolloutHooks):
        ...     def sampling(self, params):
        ...         from dataclasses import replace
        ...         return replace(params, return_entropy=True)
        ...     def after_collect(self, groups, context):
        ...         return [g for g in groups if any(t.success for t in g.trajectories)]
        >>> KeepSolved().sampling(SamplingParams()).return_entropy
        True
    """

    max_extra_rounds: int = 0
    """How many extra collection rounds the training loop may run to refill a batch that
    ``after_collect`` shrank (DAPO dynamic sampling); 0: never collect more."""

    def begin_iteration(self, iteration: int, context: CollectContext) -> None:
        """Called by the training loop before the first collection round of ``iteration``: reset what
        the hook counts per iteration here (its metrics, its collection rounds)."""

    def sampling(self, params: SamplingParams) -> SamplingParams:
        """Adjust the sampling parameters of a collection (called once per ``collect``)."""
        return params

    def before_collect(self, num_groups: int) -> None:
        """Called when a collection of ``num_groups`` groups starts; reset per-batch state here."""

    def after_turn(self, episodes: Sequence[EpisodeView], context: CollectContext) -> Sequence[Fork]:
        """Called after every turn with all episodes of the collection; return forks to perform."""
        return ()

    def after_collect(self, groups: list[EpisodeGroup], context: CollectContext) -> list[EpisodeGroup]:
        """Annotate (return new records) or filter the finished groups."""
        return groups

    def metrics(self) -> dict[str, float]:
        """What the hook did in the current iteration's collection, as ``section/name`` metrics.

        The training loop reads it once, after the iteration's last collection round, so a hook that
        filters (and so may see several rounds) accumulates over the rounds of an iteration, from
        ``begin_iteration`` on."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """State to carry across iterations and checkpoints (default: none)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Reinstate ``state_dict()`` (exact resume)."""


class HookChain(RolloutHooks):
    """Several hooks acting as one, in order.

    Example:
        >>> class Entropies(RolloutHooks):
        ...     def sampling(self, params):
        ...         from dataclasses import replace
        ...         return replace(params, return_entropy=True)
        >>> class TopK(RolloutHooks):
        ...     max_extra_rounds = 2
        ...     def sampling(self, params):
        ...         from dataclasses import replace
        ...         return replace(params, num_top_logprobs=5)
        >>> chain = HookChain([Entropies(), TopK()])
        >>> params = chain.sampling(SamplingParams())
        >>> params.return_entropy, params.num_top_logprobs, chain.max_extra_rounds
        (True, 5, 2)
    """

    def __init__(self, hooks: Sequence[RolloutHooks]) -> None:
        self.hooks = list(hooks)
        self.max_extra_rounds = max((h.max_extra_rounds for h in self.hooks), default=0)

    def begin_iteration(self, iteration: int, context: CollectContext) -> None:
        for hook in self.hooks:
            hook.begin_iteration(iteration, context)

    def sampling(self, params: SamplingParams) -> SamplingParams:
        for hook in self.hooks:
            params = hook.sampling(params)
        return params

    def before_collect(self, num_groups: int) -> None:
        for hook in self.hooks:
            hook.before_collect(num_groups)

    def after_turn(self, episodes: Sequence[EpisodeView], context: CollectContext) -> Sequence[Fork]:
        return [fork for hook in self.hooks for fork in hook.after_turn(episodes, context)]

    def after_collect(self, groups: list[EpisodeGroup], context: CollectContext) -> list[EpisodeGroup]:
        for hook in self.hooks:
            groups = hook.after_collect(groups, context)
        return groups

    def metrics(self) -> dict[str, float]:
        return {key: value for hook in self.hooks for key, value in hook.metrics().items()}

    def state_dict(self) -> dict[str, Any]:
        return {str(i): hook.state_dict() for i, hook in enumerate(self.hooks)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for i, hook in enumerate(self.hooks):
            hook.load_state_dict(state.get(str(i), {}))
