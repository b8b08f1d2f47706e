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
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Annotated, Any

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
    executor = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="sandbox-run")
    pool = WarmPool(chosen, size=pool_size, limits=defaults) if pool_size else None
    in_flight = 0

    registry = CollectorRegistry()
    runs = Counter("agentgym_sandbox_runs", "Programs run", registry=registry)
    timeouts = Counter("agentgym_sandbox_timeouts", "Runs killed by the wall clock", registry=registry)
    kills = Counter("agentgym_sandbox_kills", "Runs cut short, by reason", ["reason"], registry=registry)
    errors = Counter("agentgym_sandbox_errors", "Error responses by type", ["type"], registry=registry)
    latency = Histogram("agentgym_sandbox_run_seconds", "Wall time of a run, start-up included",
                        buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
                        registry=registry)
    Gauge("agentgym_sandbox_in_flight", "Runs in flight", registry=registry).set_function(lambda: in_flight)
    Gauge("agentgym_sandbox_pool_idle", "Warm workers ready", registry=registry).set_function(
        lambda: pool.idle if pool else 0)

    def run_blocking(request: Any, limits: Limits) -> Result:
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
    keep_integer_bounds(app)

    @app.get("/health")
    async def health() -> Response:
        return json_response({"status": "ok", "backend": chosen.name, "secure": chosen.secure,
                              "memory_guard": chosen.memory_guard,
                              "memory_guard_detail": getattr(chosen, "memory_guard_detail", ""),
                              "seccomp": bool(getattr(chosen, "seccomp", False)),
                              "pool_size": pool_size, "pool_idle": pool.idle if pool else 0,
                              "max_concurrency": max_concurrency, "in_flight": in_flight,
                              "default_limits": dataclasses.asdict(defaults),
                              "max_limits": dataclasses.asdict(maxima)})

    @app.get("/metrics", response_class=Response,
             responses={**text_responses("Prometheus text"), **error_responses(401)})
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def run(body: Any) -> Response:
        nonlocal in_flight
        limits = bounded_limits(body.limits, defaults, maxima)
        if in_flight >= max_concurrency:  # checked and taken with no await between: no race
            raise SandboxBusy(f"{in_flight} runs in flight (max_concurrency={max_concurrency}); "
                              "retry shortly")
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

    # The body model carries this server's maxima, so it is set as an object: a string annotation
    # would be looked up in the module's globals.
    run.__annotations__ = {"body": run_model, "return": Response}
    app.post("/run", responses=error_responses(401, 413, 422, 503))(run)

    return GuardMiddleware(app, token=token, max_body_bytes=max_body_bytes)


def serve(host: str = "127.0.0.1", port: int = 8100, *, backend: str = "auto", pool_size: int = 2,
          max_concurrency: int = 4, token: str | None = None) -> None:
    """Run the sandbox service with uvicorn (what ``agentgym sandbox serve`` calls)."""
    import uvicorn

    app = create_sandbox_app(default_backend(backend), pool_size=pool_size,  # type: ignore[arg-type]
                             max_concurrency=max_concurrency, token=token)
    uvicorn.run(app, host=host, port=port, log_level="info")
