"""Where an iteration's episode groups come from: ``RolloutPipeline`` (now, or collected during the previous
update) and, under several training processes, ``gather_groups`` (every process's share, in task order).

**Asynchronous rollouts** (``rollout.max_staleness: 1``). While iteration i's update runs, a worker
thread collects iteration i+1's episodes with the weights from before that update (the generator
holds its own copy of them, or lives elsewhere: a vLLM server). Iteration i+1 then trains on episodes
one update old: ``staleness`` 1, and the update importance-corrects them
(``agentgym.training.engine.offpolicy``). Every iteration's tasks, seeds and order stay those of a
synchronous run; only the weights that sampled them differ. With ``max_staleness: 0`` episodes are
collected when asked for, between updates, which is synchronous training exactly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from agentgym.rollout.collector import CollectStats
from agentgym.rollout.records import EpisodeGroup
from agentgym.training.run.interrupt import StopNow


@dataclass
class Rollout:
    """How an iteration's episodes were obtained."""

    staleness: int
    """Updates made between the start of their collection and their use."""
    wait_s: float
    """Time the loop waited for them (the whole collection when synchronous)."""
    overlap_s: float
    """Collection time that ran while an update ran (0 when synchronous)."""

    def metrics(self) -> dict[str, float]:
        return {"rollout/staleness": float(self.staleness), "perf/rollout_wait_s": self.wait_s,
                "perf/overlap_s": self.overlap_s}


@dataclass
class _Pending:
    iteration: int
    version: int
    """Updates made when the collection started."""
    future: Future[Any]
    started: float = 0.0
    finished: float = 0.0


class RolloutPipeline:
    """Collects iterations' groups synchronously, or one iteration ahead in a worker thread.

    Args:
        collect: ``collect(iteration) -> result`` (the trainer's collection of one iteration).
        max_staleness: 0 (collect when asked) or 1 (``prefetch`` the next iteration during an update).

    Example:
        >>> pipeline = RolloutPipeline(lambda i: f"groups of {i}", max_staleness=1)
        >>> pipeline.get(1)[0], pipeline.get(1)[1].staleness
        ('groups of 1', 0)
        >>> pipeline.prefetch(2); pipeline.updated(0.0, 0.0)   # iteration 1's update
        >>> result, rollout = pipeline.get(2)
        >>> result, rollout.staleness
        ('groups of 2', 1)
        >>> pipeline.close()
    """

    def __init__(self, collect: Callable[[int], Any], max_staleness: int = 0) -> None:
        if max_staleness not in (0, 1):
            raise ValueError(f"max_staleness must be 0 or 1, got {max_staleness}")
        self.collect = collect
        self.asynchronous = max_staleness == 1
        self.version = 0
        """Updates made so far (``updated`` counts them)."""
        self._pool = (ThreadPoolExecutor(1, thread_name_prefix="agentgym-rollout") if self.asynchronous
                      else None)
        self._pending: _Pending | None = None
        self._update_span = (0.0, 0.0)

    def prefetch(self, iteration: int) -> None:
        """Start collecting ``iteration`` in the background (asynchronous pipelines only)."""
        if self._pool is None or self._pending is not None:
            return
        pending = _Pending(iteration, self.version, Future())

        def run() -> Any:
            pending.started = time.perf_counter()
            try:
                return self.collect(iteration)
            finally:
                pending.finished = time.perf_counter()

        pending.future = self._pool.submit(run)
        self._pending = pending

    def updated(self, started: float, finished: float) -> None:
        """An update ran from ``started`` to ``finished`` (``time.perf_counter``): the weights moved on."""
        self.version += 1
        self._update_span = (started, finished)

    def wait(self) -> None:
        """Let a background collection finish (before anything else uses the collector)."""
        if self._pending is not None:
            self._pending.future.result()

    def get(self, iteration: int) -> tuple[Any, Rollout]:
        """``iteration``'s result: the prefetched one when there is one, else collected now."""
        began = time.perf_counter()
        pending = self._pending
        if pending is None or pending.iteration != iteration:
            result = self.collect(iteration)
            return result, Rollout(0, time.perf_counter() - began, 0.0)
        self._pending = None
        result = pending.future.result()
        start, end = self._update_span
        overlap = max(0.0, min(pending.finished, end) - max(pending.started, start))
        return result, Rollout(self.version - pending.version, time.perf_counter() - began, overlap)

    def pending_state(self) -> dict[str, Any] | None:
        """The finished background collection, for a checkpoint (waits for it); None without one, or when a
        stop cut it short (the resumed run collects that iteration again)."""
        if self._pending is None:
            return None
        try:
            result = self._pending.future.result()
        except StopNow:
            self._pending = None
            return None
        return {"iteration": self._pending.iteration, "version_lag": self.version - self._pending.version,
                "result": result}

    def abandon(self) -> None:
        """Forget the background collection (the run stops at a point before it); a stop ends its thread."""
        self._pending = None

    def load_pending_state(self, state: dict[str, Any] | None) -> None:
        """Reinstate ``pending_state()`` (a resumed run trains on the episodes the first run collected)."""
        if state is None:
            return
        done: Future[Any] = Future()
        done.set_result(state["result"])
        self._pending = _Pending(state["iteration"], self.version - state["version_lag"], done)

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
