"""Where an iteration's episode groups come from: ``RolloutPipeline`` (now, or collected during earlier
updates) and, under several training processes, ``gather_groups`` (every process's share, in task order).

**Asynchronous rollouts** (``rollout.max_staleness: K``, K >= 1). When iteration i's update starts, a
worker thread is given the collections of iterations up to i + K, and works through them in order while
the trainer goes on updating: a collection never waits for an update, and an update waits for a
collection only when the worker has fallen behind. The generator holds weights of its own (a copy, or a
server) and is sent the trainer's after every update (``agentgym.training.run.weight_sync``); a batch
trained at version v (v updates made) was sampled by versions v - K .. v, so its staleness is at most K,
and the update importance-corrects every token against the log-probs of the weights that sampled it
(``agentgym.training.engine.offpolicy``). Every iteration's tasks, seeds and order stay those of a
synchronous run; only the weights that sampled them differ. With ``max_staleness: 0`` episodes are
collected when asked for, between updates, which is synchronous training exactly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from agentgym.rollout.collector import CollectStats
from agentgym.rollout.records import EpisodeGroup
from agentgym.training.run.interrupt import StopNow


@dataclass
class Rollout:
    """How an iteration's episodes were obtained."""

    staleness: int
    """Updates made between the start of their collection and their use (the largest age of the weights
    that sampled them)."""
    wait_s: float
    """Time the loop waited for them (the whole collection when synchronous)."""
    overlap_s: float
    """Collection time that ran while updates ran (0 when synchronous)."""
    detail: dict[str, float] = field(default_factory=dict)
    """Per-turn measures of the weights' age (``weight_sync.version_metrics``), when turns carry them."""

    def metrics(self) -> dict[str, float]:
        return {"rollout/staleness": float(self.staleness), "perf/rollout_wait_s": self.wait_s,
                "perf/overlap_s": self.overlap_s, **self.detail}


@dataclass
class _Pending:
    iteration: int
    version: int
    """Updates made when the collection was queued."""
    future: Future[Any]
    started: float = 0.0
    finished: float = 0.0


class RolloutPipeline:
    """Collects iterations' groups synchronously, or up to ``max_staleness`` iterations ahead in a worker
    thread.

    Args:
        collect: ``collect(iteration) -> result`` (the trainer's collection of one iteration).
        max_staleness: 0 (collect when asked), or K (``prefetch`` up to K iterations ahead during updates).
        before_collect: called before every collection, in the thread that runs it (the generator takes
            the newest weights published to it).

    Example:
        >>> pipeline = RolloutPipeline(lambda i: f"groups of {i}", max_staleness=2)
        >>> pipeline.get(1)[0], pipeline.get(1)[1].staleness
        ('groups of 1', 0)
        >>> pipeline.prefetch(3); pipeline.updated(0.0, 0.0)   # iteration 1's update
        >>> [pipeline.get(i)[0] for i in (2,)], pipeline.queued_beyond(2)
        (['groups of 2'], True)
        >>> pipeline.prefetch(4); pipeline.updated(0.0, 0.0)   # iteration 2's update
        >>> result, rollout = pipeline.get(3)
        >>> result, rollout.staleness                          # queued before iteration 1's update
        ('groups of 3', 2)
        >>> pipeline.close()
    """

    def __init__(self, collect: Callable[[int], Any], max_staleness: int = 0, *,
                 before_collect: Callable[[], None] | None = None) -> None:
        if isinstance(max_staleness, bool) or not isinstance(max_staleness, int) or max_staleness < 0:
            raise ValueError(f"max_staleness must be an int >= 0, got {max_staleness!r}")
        self.collect = collect
        self.before_collect = before_collect
        self.max_staleness = max_staleness
        self.asynchronous = max_staleness >= 1
        self.version = 0
        """Updates made so far (``updated`` counts them)."""
        self._pool = (ThreadPoolExecutor(1, thread_name_prefix="agentgym-rollout") if self.asynchronous
                      else None)
        self._pending: dict[int, _Pending] = {}
        self._queued = 0
        """The last iteration collected or queued."""
        self._update_spans: list[tuple[float, float]] = []

    def _run(self, iteration: int) -> Any:
        if self.before_collect is not None:
            self.before_collect()
        return self.collect(iteration)

    def prefetch(self, through: int) -> None:
        """Queue the collections of the iterations after the last one queued, up to ``through``
        (asynchronous pipelines only; the worker runs them in order)."""
        if self._pool is None:
            return
        for iteration in range(self._queued + 1, through + 1):
            pending = _Pending(iteration, self.version, Future())

            def run(pending: _Pending = pending) -> Any:
                pending.started = time.perf_counter()
                try:
                    return self._run(pending.iteration)
                finally:
                    pending.finished = time.perf_counter()

            pending.future = self._pool.submit(run)
            self._pending[iteration] = pending
            self._queued = iteration

    def queued_beyond(self, iteration: int) -> bool:
        """Whether a collection of an iteration after ``iteration`` is queued or running."""
        return any(queued > iteration for queued in self._pending)

    def updated(self, started: float, finished: float) -> None:
        """An update ran from ``started`` to ``finished`` (``time.perf_counter``): the weights moved on."""
        self.version += 1
        self._update_spans = [*self._update_spans[-self.max_staleness - 1:], (started, finished)]

    def wait(self) -> None:
        """Let every queued collection finish (before anything else uses the collector)."""
        for pending in list(self._pending.values()):
            pending.future.result()

    def get(self, iteration: int) -> tuple[Any, Rollout]:
        """``iteration``'s result: the queued one when there is one, else collected now."""
        began = time.perf_counter()
        pending = self._pending.pop(iteration, None)
        if pending is None:
            result = self._run(iteration)
            self._queued = max(self._queued, iteration)
            return result, Rollout(0, time.perf_counter() - began, 0.0)
        result = pending.future.result()
        overlap = sum(max(0.0, min(pending.finished, end) - max(pending.started, start))
                      for start, end in self._update_spans)
        return result, Rollout(self.version - pending.version, time.perf_counter() - began, overlap)

    def pending_state(self) -> list[dict[str, Any]]:
        """The queued collections, finished, for a checkpoint (waits for them); a stop that cut one short
        ends the list there (the resumed run collects those iterations again)."""
        state = []
        for iteration, pending in sorted(self._pending.items()):
            try:
                result = pending.future.result()
            except StopNow:
                self.abandon()
                break
            state.append({"iteration": iteration, "version_lag": self.version - pending.version,
                          "result": result})
        return state

    def abandon(self) -> None:
        """Forget the queued collections (the run stops at a point before them): those not started are
        cancelled, and a stop ends the running one's thread."""
        for pending in self._pending.values():
            pending.future.cancel()
        self._pending = {}

    def load_pending_state(self, state: list[dict[str, Any]] | dict[str, Any] | None) -> None:
        """Reinstate ``pending_state()`` (a resumed run trains on the episodes the first run collected)."""
        entries = [] if state is None else [state] if isinstance(state, dict) else state
        for entry in entries:
            done: Future[Any] = Future()
            done.set_result(entry["result"])
            iteration = entry["iteration"]
            self._pending[iteration] = _Pending(iteration, self.version - entry["version_lag"], done)
            self._queued = max(self._queued, iteration)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def merge_stats(total: CollectStats, part: CollectStats) -> None:
    """Add ``part``'s counters and timings to ``total``."""
    for name, value in vars(part).items():
        setattr(total, name, getattr(total, name) + value)


def gather_groups(dist: Any, groups: list[EpisodeGroup], stats: CollectStats
                  ) -> tuple[list[EpisodeGroup], CollectStats]:
    """Every process's groups, in task order (process r collected tasks r, r + W, ...), and the summed
    statistics: afterwards every process holds the whole iteration."""
    gathered = dist.gather_objects([groups, vars(stats)])
    total = CollectStats()
    for _, part in gathered:
        merge_stats(total, CollectStats(**part))
    shares = [part_groups for part_groups, _ in gathered]
    ordered = [share[j] for j in range(max(map(len, shares))) for share in shares if j < len(share)]
    return ordered, total
