"""The sandbox service: ``create_sandbox_app`` (FastAPI) and ``serve``; its client is ``agentgym.sandbox.client``.

Routes (errors are ``{"error": {"type", "message"}}`` as on the env service):

    POST /run       {code, stdin?, limits?} → Result fields; limits are bounded by the server's maxima
    GET  /health    backend name, ``secure`` flag, warm-pool size, concurrency
    GET  /metrics   Prometheus text: runs, timeouts, kills by reason, run latency

Status codes: 401 bad token, 413 body too large, 422 malformed request or limits over the maxima,
503 (with Retry-After) when ``max_concurrency`` runs are already in flight.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from pydantic import BaseModel, ConfigDict, Field

from agentgym.errors import RequestRejected, SandboxBusy
from agentgym.http.fastpath import GuardMiddleware
from agentgym.http.responses import ErrorResponses, json_response
from agentgym.sandbox.backends import Backend, Limits, Result, default_backend
from agentgym.sandbox.pool import WarmPool


class LimitsOverride(BaseModel):
    """Per-request limits; each must be at most the server's maximum (``GET /health``)."""

    model_config = ConfigDict(extra="forbid")
    wall_clock_s: float | None = Field(None, gt=0)
    cpu_s: int | None = Field(None, gt=0)
    memory_mb: int | None = Field(None, gt=0)
    max_processes: int | None = Field(None, gt=0)
    output_bytes: int | None = Field(None, gt=0)
    file_size_mb: int | None = Field(None, gt=0)
    open_files: int | None = Field(None, gt=0)


class RunRequest(BaseModel):
    """Body of ``POST /run``."""

    model_config = ConfigDict(extra="forbid")
    code: str = Field(..., max_length=1_000_000)
    stdin: str = Field("", max_length=4_000_000)
    limits: LimitsOverride | None = None


def bounded_limits(override: LimitsOverride | None, defaults: Limits, maxima: Limits) -> Limits:
    """``defaults`` with ``override`` applied, each value checked against ``maxima``.

    Raises:
        RequestRejected: a value is over its maximum (the message names the field and the maximum).
    """
    chosen = dataclasses.replace(defaults, **(override.model_dump(exclude_none=True) if override else {}))
    for item in dataclasses.fields(Limits):
        value, ceiling = getattr(chosen, item.name), getattr(maxima, item.name)
        if item.name == "cpu_s":
            value, ceiling = chosen.cpu_limit_s, maxima.cpu_limit_s
        if value is not None and ceiling is not None and value > ceiling:
            raise RequestRejected(f"limits.{item.name}={value} is over this server's maximum of {ceiling}")
    return chosen


def create_sandbox_app(
    backend: Backend | None = None,
    *,
    pool_size: int = 0,
    default_limits: Limits | None = None,
    max_limits: Limits | None = None,
    max_concurrency: int = 4,
    token: str | None = None,
    max_body_bytes: int = 2 * 1024 * 1024,
) -> GuardMiddleware:
    """The ASGI app of the sandbox service.

    Args:
        backend: where code runs (default ``default_backend("auto")``: bwrap, else docker).
        pool_size: warm workers kept ready (0: spawn one per request).
        default_limits: limits of a request that sends none (default ``Limits()``).
        max_limits: the largest limits a request may ask for (default ``Limits(wall_clock_s=30,
            memory_mb=2048, max_processes=64, output_bytes=1 MiB)``).
        max_concurrency: runs in flight at once; more get 503 with Retry-After.
        token: when set, every route but ``/health`` needs ``Authorization: Bearer <token>``.
        max_body_bytes: larger request bodies get 413.

    Returns:
        The FastAPI app behind the env service's ``GuardMiddleware`` (token and size limit).
        Serve it on 127.0.0.1 unless it must be reached from elsewhere.
    """
    chosen = backend if backend is not None else default_backend("auto")
    defaults = default_limits or Limits()
    maxima = max_limits or Limits(wall_clock_s=30, memory_mb=2048, max_processes=64, output_bytes=1024 * 1024)
    bounded_limits(None, defaults, maxima)  # the defaults must fit the maxima themselves
    executor = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="sandbox-run")
    pool = WarmPool(chosen, size=pool_size) if pool_size else None
    in_flight = 0

    registry = CollectorRegistry()
    runs = Counter("agentgym_sandbox_runs", "Programs run", registry=registry)
    timeouts = Counter("agentgym_sandbox_timeouts", "Runs killed by the wall clock", registry=registry)
    kills = Counter("agentgym_sandbox_kills", "Runs cut short, by reason", ["reason"], registry=registry)
    errors = Counter("agentgym_sandbox_errors", "Error responses by type", ["type"], registry=registry)
    latency = Histogram("agentgym_sandbox_run_seconds", "Wall time of a run, start-up included",
                        buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=registry)
    Gauge("agentgym_sandbox_in_flight", "Runs in flight", registry=registry).set_function(lambda: in_flight)
    Gauge("agentgym_sandbox_pool_idle", "Warm workers ready", registry=registry).set_function(
        lambda: pool.idle if pool else 0)

    def run_blocking(request: RunRequest, limits: Limits) -> Result:
        runner = pool if pool is not None else chosen
        return runner.run(request.code, request.stdin, limits)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        if pool is not None:
            pool.close()
        executor.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="agentgym sandbox", lifespan=lifespan)

    ErrorResponses(errors).install(app)

    @app.get("/health")
    async def health() -> Response:
        return json_response({"status": "ok", "backend": chosen.name, "secure": chosen.secure,
                      "pool_size": pool_size, "pool_idle": pool.idle if pool else 0,
                      "max_concurrency": max_concurrency, "in_flight": in_flight,
                      "max_limits": dataclasses.asdict(maxima)})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/run")
    async def run(body: RunRequest) -> Response:
        nonlocal in_flight
        limits = bounded_limits(body.limits, defaults, maxima)
        if in_flight >= max_concurrency:  # checked and taken with no await between: no race
            raise SandboxBusy(f"{in_flight} runs in flight (max_concurrency={max_concurrency}); retry shortly")
        in_flight += 1
        started = time.monotonic()
        try:
            result = await asyncio.get_running_loop().run_in_executor(executor, run_blocking, body, limits)
        finally:
            in_flight -= 1
        latency.observe(time.monotonic() - started)
        runs.inc()
        if result.timed_out:
            timeouts.inc()
        if result.killed_reason is not None:
            kills.labels(result.killed_reason).inc()
        return json_response(result.to_dict())

    return GuardMiddleware(app, token=token, max_body_bytes=max_body_bytes)


def serve(host: str = "127.0.0.1", port: int = 8100, *, backend: str = "auto", pool_size: int = 2,
          max_concurrency: int = 4, token: str | None = None) -> None:
    """Run the sandbox service with uvicorn (what ``agentgym sandbox serve`` calls)."""
    import uvicorn

    app = create_sandbox_app(default_backend(backend), pool_size=pool_size,  # type: ignore[arg-type]
                             max_concurrency=max_concurrency, token=token)
    uvicorn.run(app, host=host, port=port, log_level="info")
