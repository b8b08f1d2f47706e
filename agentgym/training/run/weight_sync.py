"""The trained weights on their way to what generates, during asynchronous rollouts.

After every update the trainer ``publish``-es its weights, numbered by the updates made so far (the
*policy version*). How they reach the generator depends on what it is:

- **a copy in this process** (``is_trained_model`` backends generate with ``detached_copy()``): the
  publish takes a snapshot of the trainable tensors (the update goes on changing the model), and the
  generating thread loads the newest snapshot itself: before its next turn (``partial_rollouts``: the
  episodes in flight continue under the new weights) or before its next collection;
- **a server** (``takes_weights_in_flight``: vLLM behind HTTP): the weights are sent at once, from the
  trainer's thread, while requests are in flight; requests made after the swap use them.

Every turn a ``VersionedPolicy`` samples carries ``extras["policy_version"]``, the version of the weights
that sampled it, beside its behaviour log-probs; the update importance-corrects each token against them.

Every sync runs under a deadline (``rollout.weight_sync_timeout_s``): a sync that hangs (a server that
stopped answering, a lost collective) ends the run with ``WeightSyncTimeout`` naming the generator,
instead of leaving it waiting forever.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from agentgym.errors import AgentGymError, ConfigError
from agentgym.rollout.policy import Generation, SamplingParams, capability


class WeightSyncTimeout(AgentGymError):
    """Loading the trained weights into the generator did not finish within the deadline."""

    http_status = 504


def bounded(sync: Callable[[], None], timeout_s: float, what: str) -> None:
    """Run ``sync`` with a deadline: its error is re-raised here; past ``timeout_s`` seconds,
    ``WeightSyncTimeout``. (A thread cannot be killed: a hung sync is left behind while the run ends.)

    Example:
        >>> import time
        >>> bounded(lambda: None, 1.0, "a copy")
        >>> try:
        ...     bounded(lambda: time.sleep(5), 0.05, "a stuck server")
        ... except WeightSyncTimeout as error:
        ...     print(str(error)[:59])
        the weight sync to a stuck server did not finish in 0.05 s;
    """
    failure: list[BaseException] = []

    def run() -> None:
        try:
            sync()
        except BaseException as error:  # handed to the waiting thread
            failure.append(error)

    worker = threading.Thread(target=run, name="agentgym-weight-sync", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise WeightSyncTimeout(f"the weight sync to {what} did not finish in {timeout_s:g} s; check that it "
                                f"is alive and answering, or raise rollout.weight_sync_timeout_s")
    if failure:
        raise failure[0]


def trainable_snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Copies of the tensors an update changes (the frozen ones are the generator's already)."""
    return {name: param.detach().clone() for name, param in model.named_parameters() if param.requires_grad}


class InFlightWeights:
    """Publishes the trainer's weights to an asynchronous run's generator (see the module docstring).

    Args:
        generator: what generates (a ``detached_copy()``, or a policy that takes weights in flight).
        model: the trained model.
        partial_rollouts: a copy loads new weights at its next turn (True) or its next collection.
        timeout_s: deadline of every sync.
    """

    def __init__(self, generator: Any, model: torch.nn.Module, *, partial_rollouts: bool,
                 timeout_s: float) -> None:
        self.generator = generator
        self.model = model
        self.partial_rollouts = partial_rollouts
        self.timeout_s = timeout_s
        self.in_flight = bool(capability(generator, "takes_weights_in_flight"))
        self.version = 0
        """The version of the weights the generator holds."""
        self._lock = threading.Lock()
        self._pending: tuple[int, dict[str, torch.Tensor]] | None = None
        self.what = type(generator).__name__

    def publish(self, version: int) -> None:
        """The trainer's weights after ``version`` updates (call from the trainer, between updates)."""
        if self.in_flight:
            bounded(lambda: self.generator.sync_weights(self.model), self.timeout_s, self.what)
            self.version = version
            return
        snapshot = trainable_snapshot(self.model)
        with self._lock:
            self._pending = (version, snapshot)

    def sync_now(self, version: int) -> None:
        """Load all of the trainer's weights now (nothing may be generating: before the first collection,
        after a warm start or a restore, and before evaluations)."""
        with self._lock:
            self._pending = None
        bounded(lambda: self.generator.sync_weights(self.model), self.timeout_s, self.what)
        self.version = version

    def take(self) -> None:
        """Load the newest published weights, if any are waiting (from the generating thread)."""
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            version, snapshot = pending
            bounded(lambda: self.generator.sync_weights(snapshot), self.timeout_s, self.what)
            self.version = version


class VersionedPolicy:
    """The generator of an asynchronous run: takes waiting weights at each turn (``partial_rollouts``) and
    marks every generation with the version of the weights that sampled it. Everything else is the
    wrapped policy's (capabilities, tokenizer, ``score``)."""

    def __init__(self, weights: InFlightWeights) -> None:
        self.weights = weights
        self.policy = weights.generator

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        if self.weights.partial_rollouts:
            self.weights.take()
        version = self.weights.version
        return [replace(g, extras={**g.extras, "policy_version": version})
                for g in self.policy.generate(prompts, params)]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)


def turn_versions(groups: Sequence[Any]) -> list[int]:
    """The ``policy_version`` of every turn of ``groups`` that has one."""
    return [int(turn.extras["policy_version"]) for group in groups for trajectory in group.trajectories
            for turn in trajectory.turns if "policy_version" in turn.extras]


def version_metrics(groups: Sequence[Any], version: int) -> dict[str, float]:
    """How old the weights that sampled ``groups`` are, at ``version``: the largest and mean staleness over
    turns, and the share of trajectories sampled by more than one version (partial rollouts)."""
    versions = turn_versions(groups)
    if not versions:
        return {}
    mixed = [len({int(t.extras["policy_version"]) for t in trajectory.turns
                  if "policy_version" in t.extras}) > 1
             for group in groups for trajectory in group.trajectories]
    return {"rollout/staleness": float(version - min(versions)),
            "rollout/staleness_mean": float(version - sum(versions) / len(versions)),
            "rollout/mixed_version_share": sum(mixed) / max(len(mixed), 1)}




def rollout_generator(policy: Any, model: torch.nn.Module, rollout: Any, *, seed: int,
                      world_size: int) -> tuple[Any, InFlightWeights | None]:
    """What rollouts sample from, and the in-flight weights behind it: the policy itself (``None``), or, for
    asynchronous rollouts (``rollout.max_staleness`` > 0), a ``VersionedPolicy`` over a copy of the trained
    model's weights (the update changes the model while episodes are collected) or over a server that takes
    weights in flight.

    Raises:
        ConfigError: asynchronous rollouts with several training processes, or with a policy that can take
            new weights neither as a copy nor while it generates.
    """
    if not rollout.max_staleness:
        return policy, None
    if world_size > 1:
        raise ConfigError("rollout.max_staleness > 0 is for one training process (its background "
                          "collection would interleave collective calls with the update's); set "
                          "rollout.max_staleness=0")
    if capability(policy, "pauses_for_updates"):
        raise ConfigError("rollout.max_staleness > 0 generates during updates, but model.vllm.sleep puts "
                          "the colocated engine to sleep for them: use model.backend=vllm-server")
    if capability(policy, "is_trained_model"):
        generator = policy.detached_copy(seed)
    elif capability(policy, "takes_weights_in_flight"):
        generator = policy
    else:
        raise ConfigError(f"rollout.max_staleness > 0 generates while the trainer updates, but "
                          f"{type(policy).__name__} can take new weights neither as a copy nor "
                          f"while it generates: use model.backend=vllm-server or rollout.max_staleness=0")
    weights = InFlightWeights(generator, model, partial_rollouts=rollout.partial_rollouts,
                              timeout_s=rollout.weight_sync_timeout_s)
    return VersionedPolicy(weights), weights


__all__ = ["InFlightWeights", "VersionedPolicy", "WeightSyncTimeout", "bounded", "rollout_generator",
           "trainable_snapshot", "turn_versions", "version_metrics"]
