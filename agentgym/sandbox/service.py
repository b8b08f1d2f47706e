"""The sandbox service: ``create_sandbox_app`` (FastAPI) and ``serve``; its client is
``agentgym.sandbox.client``.

Routes (errors are ``{"error": {"type", "message"}}`` as on the env service):

    POST /run       {code, stdin?, limits?} → Result fields; limits are bounded by the server's maxima
    GET  /health    backend name, ``secure`` flag, ``memory_guard`` (cgroup | supervisor | docker),
                    ``seccomp``, warm-pool size, concurrency, default and maximum limits
    GET  /metrics   Prometheus text: runs, timeouts, kills by reason, run latency

Status codes: 401 bad token, 413 body too large, 422 malformed request or limits over the maxima
(the maxima are in the OpenAPI schema), 503 (with Retry-After) when ``max_concurrency`` runs are
already in flight. At start-up it deletes what a killed predecessor left: scratch dirs and run cgroups.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from pydantic import BaseModel, ConfigDict, Field, create_model

from agentgym.errors import ConfigError, RequestRejected, SandboxBusy
from agentgym.sandbox.backends import Backend, default_backend
from agentgym.sandbox.cgroup import clean_stale_cgroups
from agentgym.sandbox.limits import Limits, Result
from agentgym.sandbox.pool import WarmPool
from agentgym.sandbox.worker import clean_stale_scratch
from agentgym.service_kit.guard import GuardMiddleware
from agentgym.service_kit.responses import (
    ErrorResponses,
    error_responses,
    json_response,
    keep_integer_bounds,
    text_responses,
)
from agentgym.service_kit.wire import whole_number

_LIMIT_MEANINGS = {
    "wall_clock_s": "Wall-clock budget of the run (seconds).",
    "cpu_s": "CPU seconds per process.",
    "memory_mb": "Memory of each process and of the whole run (MiB).",
    "max_processes": "Processes and threads of the run.",
    "output_bytes": "Cap on stdout + stderr together (bytes).",
    "file_size_mb": "Largest file the code may write (MiB).",
    "open_files": "Open file descriptors per process.",
    "disk_mb": "Size of the run's scratch space (MiB).",
}


def request_models(maxima: Limits) -> tuple[type[BaseModel], type[BaseModel]]:
    """``(LimitsOverride, RunRequest)``: the body models of ``POST /run`` for a server with ``maxima``.

    Strict, as the env service's requests (``wall_clock_s: true`` is a 422), with every limit's
    range in the schema: ``(0, maximum]``.

    Example:
        >>> limits_model, _ = request_models(Limits(wall_clock_s=30))
        >>> limits_model.model_json_schema()["properties"]["wall_clock_s"]["anyOf"][0]["maximum"]
        30.0
    """
    fields: dict[str, Any] = {}
    for item in dataclasses.fields(Limits):
        ceiling = maxima.cpu_limit_s if item.name == "cpu_s" else getattr(maxima, item.name)
        if item.name == "wall_clock_s":
            ceiling = float(ceiling)
            # In the type: the schema shows the range.
            bounded: Any = Annotated[float, Field(gt=0, le=ceiling)]
        else:
            bounded = whole_number(gt=0, le=int(ceiling))
        fields[item.name] = (bounded | None,
                             Field(None, description=f"{_LIMIT_MEANINGS[item.name]} At most {ceiling}."))
    strict = ConfigDict(extra="forbid", strict=True)
    limits_model = create_model("LimitsOverride", __config__=strict,
                                __doc__="Per-request limits; each at most the server's maximum.", **fields)
    run_model = create_model(
        "RunRequest", __config__=strict, __doc__="Body of ``POST /run``.",
        code=(str, Field(..., max_length=1_000_000, description="Python source, run as __main__.")),
        stdin=(str, Field("", max_length=4_000_000, description="The program's standard input.")),
        limits=(limits_model | None, Field(None, description="Limits of this run (default: the server's).")),
    )
    return limits_model, run_model


#: The largest limits a request may ask for, unless the server is given others.
DEFAULT_MAX_LIMITS = Limits(wall_clock_s=30, memory_mb=2048, max_processes=64, output_bytes=1024 * 1024,
                            disk_mb=1024)
#: The body models for the default maxima.
LimitsOverride, RunRequest = request_models(DEFAULT_MAX_LIMITS)


def bounded_limits(override: BaseModel | None, defaults: Limits, maxima: Limits) -> Limits:
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
    maxima = max_limits or DEFAULT_MAX_LIMITS
    for name, value in (("max_concurrency", max_concurrency), ("max_body_bytes", max_body_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 0:
        raise ConfigError(f"pool_size must be an integer >= 0, got {pool_size!r}")
    bounded_limits(None, defaults, maxima)  # the defaults must fit the maxima themselves
    _, run_model = request_models(maxima)
    # What a service killed with kill -9 left behind: scratch dirs and run cgroups of dead owners.
    clean_stale_scratch(getattr(chosen, "scratch_root", None))
    clean_stale_cgroups()
    sandbox = SandboxService(chosen, pool_size=pool_size, defaults=defaults, maxima=maxima,
                             max_concurrency=max_concurrency)
    app = FastAPI(title="agentgym sandbox", lifespan=_lifespan)
    app.state.sandbox = sandbox
    ErrorResponses(sandbox.metrics.errors).install(app)
    keep_integer_bounds(app)
    _add_routes(app, run_model)
    return GuardMiddleware(app, token=token, max_body_bytes=max_body_bytes)


class SandboxMetrics:
    """The sandbox's Prometheus metrics, in a registry of their own (one per app)."""

    def __init__(self, in_flight: Callable[[], float], pool_idle: Callable[[], float]) -> None:
        self.registry = registry = CollectorRegistry()
        self.runs = Counter("agentgym_sandbox_runs", "Programs run", registry=registry)
        self.timeouts = Counter("agentgym_sandbox_timeouts", "Runs killed by the wall clock",
                                registry=registry)
        self.kills = Counter("agentgym_sandbox_kills", "Runs cut short, by reason", ["reason"],
                             registry=registry)
        self.errors = Counter("agentgym_sandbox_errors", "Error responses by type", ["type"],
                              registry=registry)
        self.latency = Histogram("agentgym_sandbox_run_seconds", "Wall time of a run, start-up included",
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
                                 registry=registry)
        Gauge("agentgym_sandbox_in_flight", "Runs in flight", registry=registry).set_function(in_flight)
        Gauge("agentgym_sandbox_pool_idle", "Warm workers ready", registry=registry).set_function(pool_idle)

    def observe(self, result: Result, seconds: float) -> None:
        """Count one finished run that took ``seconds``."""
        self.latency.observe(seconds)
        self.runs.inc()
        if result.timed_out:
            self.timeouts.inc()
        if result.killed_reason is not None:
            self.kills.labels(result.killed_reason).inc()


class SandboxService:
    """What the sandbox's routes share: the backend (or its warm pool), the limits, the threads runs
    wait in, the count of runs in flight and the metrics.

    The app keeps it as ``app.state.sandbox``; routes reach it through ``Depends(sandbox_service)``.
    """

    def __init__(self, backend: Backend, *, pool_size: int, defaults: Limits, maxima: Limits,
                 max_concurrency: int) -> None:
        self.backend, self.pool_size, self.max_concurrency = backend, pool_size, max_concurrency
        self.defaults, self.maxima = defaults, maxima
        self.executor = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="sandbox-run")
        self.pool = WarmPool(backend, size=pool_size, limits=defaults) if pool_size else None
        self.in_flight = 0
        self.metrics = SandboxMetrics(lambda: self.in_flight, lambda: self.pool.idle if self.pool else 0)

    def health(self) -> dict[str, Any]:
        """The body of ``GET /health``: what runs code here and what bounds a run."""
        chosen, pool = self.backend, self.pool
        return {"status": "ok", "backend": chosen.name, "secure": chosen.secure,
                "memory_guard": chosen.memory_guard,
                "memory_guard_detail": getattr(chosen, "memory_guard_detail", ""),
                "seccomp": bool(getattr(chosen, "seccomp", False)),
                "pool_size": self.pool_size, "pool_idle": pool.idle if pool else 0,
                "max_concurrency": self.max_concurrency, "in_flight": self.in_flight,
                "default_limits": dataclasses.asdict(self.defaults),
                "max_limits": dataclasses.asdict(self.maxima)}

    async def run(self, request: Any) -> Result:
        """Run a ``POST /run`` body's code in a worker thread, within its limits.

        Raises:
            RequestRejected: a limit is over this server's maximum.
            SandboxBusy: ``max_concurrency`` runs are already in flight.
        """
        limits = bounded_limits(request.limits, self.defaults, self.maxima)
        if self.in_flight >= self.max_concurrency:  # checked and taken with no await between: no race
            raise SandboxBusy(f"{self.in_flight} runs in flight (max_concurrency={self.max_concurrency}); "
                              "retry shortly")
        self.in_flight += 1
        started = time.monotonic()
        try:
            result = await asyncio.get_running_loop().run_in_executor(self.executor, self._run_blocking,
                                                                      request, limits)
        finally:
            self.in_flight -= 1
        self.metrics.observe(result, time.monotonic() - started)
        return result

    def _run_blocking(self, request: Any, limits: Limits) -> Result:
        runner = self.pool if self.pool is not None else self.backend
        return runner.run(request.code, request.stdin, limits)

    def close(self) -> None:
        """Stop the warm workers and the run threads (runs still queued are cancelled)."""
        if self.pool is not None:
            self.pool.close()
        self.executor.shutdown(wait=False, cancel_futures=True)


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    yield
    app.state.sandbox.close()


async def sandbox_service(request: Request) -> SandboxService:
    """The ``SandboxService`` of the app serving ``request`` (a FastAPI dependency; ``async`` so that
    FastAPI calls it on the event loop, not in a worker thread)."""
    return request.app.state.sandbox


Sandbox = Annotated[SandboxService, Depends(sandbox_service)]


def _add_routes(app: FastAPI, run_model: type[BaseModel]) -> None:
    """The routes, in the order ``/openapi.json`` lists them.

    Added to the app itself, not through an included ``APIRouter``: recent FastAPI keeps an included
    router as one nested route, and the 405 answer's ``Allow`` reads each route's methods.
    """
    app.get("/health")(health)
    app.get("/metrics", response_class=Response,
            responses={**text_responses("Prometheus text"), **error_responses(401)})(metrics)
    app.post("/run", responses=error_responses(401, 413, 422, 503))(_run_route(run_model))


async def health(sandbox: Sandbox) -> Response:
    return json_response(sandbox.health())


async def metrics(sandbox: Sandbox) -> Response:
    return Response(generate_latest(sandbox.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _run_route(run_model: type[BaseModel]) -> Callable[..., Awaitable[Response]]:
    """The endpoint of ``POST /run`` for a server whose body model is ``run_model``."""

    async def run(body: Any, sandbox: Sandbox) -> Response:
        return json_response((await sandbox.run(body)).to_dict())

    # The body model carries this server's maxima, so it is set as an object: a string annotation
    # would be looked up in the module's globals.
    run.__annotations__ = {"body": run_model, "sandbox": Sandbox, "return": Response}
    return run


def serve(host: str = "127.0.0.1", port: int = 8100, *, backend: str = "auto", pool_size: int = 2,
          max_concurrency: int = 4, token: str | None = None) -> None:
    """Run the sandbox service with uvicorn (what ``agentgym sandbox serve`` calls)."""
    import uvicorn

    app = create_sandbox_app(default_backend(backend), pool_size=pool_size,  # type: ignore[arg-type]
                             max_concurrency=max_concurrency, token=token)
    uvicorn.run(app, host=host, port=port, log_level="info")
