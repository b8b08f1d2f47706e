"""``ServiceMetrics``: the env service's Prometheus metrics (one registry per app)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

if TYPE_CHECKING:
    from agentgym.http.sessions import SessionStore


class ServiceMetrics:
    """Counters and histograms exported at ``GET /metrics``.

    A registry per app (not the global one) so several services in one process — tests, the
    benchmark — keep separate counts.
    """

    def __init__(self, store: SessionStore) -> None:
        self.registry = CollectorRegistry()
        self.steps = Counter("agentgym_steps", "Env steps served", ["route"], registry=self.registry)
        self.resets = Counter("agentgym_resets", "Env resets served", registry=self.registry)
        self.step_seconds = Histogram(
            "agentgym_step_request_seconds", "Wall time of a step request (batched: per batch)", ["route"],
            buckets=(0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5, 30),
            registry=self.registry,
        )
        self.sessions_created = Counter("agentgym_sessions_created", "Sessions created (incl. forks)",
                                        registry=self.registry)
        self.errors = Counter("agentgym_errors", "Error responses by error type", ["type"],
                              registry=self.registry)
        Gauge("agentgym_sessions_active", "Live sessions", registry=self.registry).set_function(
            lambda: len(store.sessions))
        Gauge("agentgym_sessions_max", "Session capacity", registry=self.registry).set_function(
            lambda: store.max_sessions)
        Gauge("agentgym_sessions_reaped", "Sessions closed by the idle reaper",
              registry=self.registry).set_function(lambda: store.reaped_total)
        self._single = (self.steps.labels("single"), self.step_seconds.labels("single"))
        self._batched = (self.steps.labels("batch"), self.step_seconds.labels("batch"))

    def observe_steps(self, count: int, seconds: float, *, batched: bool = False) -> None:
        steps, histogram = self._batched if batched else self._single
        steps.inc(count)
        histogram.observe(seconds)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
