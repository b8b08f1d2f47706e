"""The retrieval service: ``create_retrieval_app`` (FastAPI over an ``Index``) and ``serve_index``.

Routes (every error is ``{"error": {"type", "message"}}``, as in the env service):

    POST /retrieve     {"queries": [str, ...], "k": int} → {"results": [[{id, title, text, score}, ...], ...]}
    GET  /health       liveness and corpus size (no token needed)
    GET  /metrics      Prometheus text

Status codes: 401 bad token, 413 body too large, 422 malformed request (bad JSON, ``k`` out of
``[1, max_k]``, too many or too long queries; the bounds are in the OpenAPI schema). It needs the
``server`` extra (FastAPI). The client is ``agentgym.retrieval.client.RetrievalClient``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from pydantic import BaseModel, ConfigDict, Field, create_model

from agentgym.errors import ConfigError
from agentgym.retrieval.index import Hit, Index
from agentgym.service_kit.guard import GuardMiddleware
from agentgym.service_kit.responses import (
    TELEMETRY_OFF,
    ErrorResponses,
    error_responses,
    json_response,
    keep_integer_bounds,
    text_responses,
)
from agentgym.service_kit.wire import whole_number

#: Most queries in one request and longest query (characters) the service accepts.
MAX_QUERIES = 256
MAX_QUERY_CHARS = 2_000


def retrieve_request_model(max_k: int = 50, max_queries: int = MAX_QUERIES) -> type[BaseModel]:
    """The body model of ``POST /retrieve`` for a service with these bounds (they show in its schema).

    Strict, as the env service's requests: ``k: true`` or ``k: "3"`` is a 422, ``k: 3.0`` is 3.

    Example:
        >>> model = retrieve_request_model(max_k=5)
        >>> model(queries=["Zorvex Labs"], k=3.0).k
        3
        >>> model.model_json_schema()["properties"]["k"]["maximum"]
        5
    """
    query = Annotated[str, Field(max_length=MAX_QUERY_CHARS)]
    return create_model(
        "RetrieveRequest",
        __config__=ConfigDict(extra="forbid", strict=True,
                              json_schema_extra={"examples": [{"queries": ["Zorvex Labs"], "k": 3}]}),
        __doc__="Body of ``POST /retrieve``.",
        queries=(list[query], Field(min_length=1, max_length=max_queries,
                                    description=f"Queries, answered in order: 1 to {max_queries}, each "
                                                f"at most {MAX_QUERY_CHARS} characters.")),
        k=(whole_number(ge=1, le=max_k), Field(3, description=f"Documents per query, in [1, {max_k}].")),
    )


#: The body model with the default bounds.
RetrieveRequest = retrieve_request_model()


def create_retrieval_app(
    index: Index | str | Path,
    *,
    token: str | None = None,
    max_k: int = 50,
    max_queries: int = MAX_QUERIES,
    max_body_bytes: int = 1024 * 1024,
    num_workers: int = 4,
) -> GuardMiddleware:
    """Build the retrieval service app (an ASGI app for uvicorn).

    Args:
        index: an ``Index`` or the directory of one (``build_index`` output).
        token: when set, every route but ``/health`` needs ``Authorization: Bearer <token>``.
        max_k: largest ``k`` a request may ask for.
        max_queries: most queries per request.
        max_body_bytes: larger request bodies get 413.
        num_workers: threads that run searches (off the event loop).

    Returns:
        The FastAPI app behind the env service's ``GuardMiddleware`` (token and size limit).

    Raises:
        ConfigError: the index directory cannot be loaded or an argument is out of range.

    Example:
        >>> app = create_retrieval_app(Index([{"id": "d1", "title": "Ostavia", "text": "A country."}]))
        >>> sorted(r.path for r in app.routes if not r.path.startswith(("/docs", "/openapi", "/redoc")))
        ['/health', '/metrics', '/retrieve']
    """
    for name, value in (("max_k", max_k), ("max_queries", max_queries), ("num_workers", num_workers),
                        ("max_body_bytes", max_body_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    if not isinstance(index, Index):
        index = Index.load(index)
    service = RetrievalService(index, max_k=max_k, num_workers=num_workers)
    app = FastAPI(title="agentgym retrieval service", lifespan=_lifespan, **TELEMETRY_OFF,
                  description="BM25 document retrieval. "
                              "Every error body is {\"error\": {\"type\", \"message\"}}.")
    app.state.index = index
    app.state.retrieval = service
    keep_integer_bounds(app)
    ErrorResponses(service.metrics.errors).install(app)
    _add_routes(app, retrieve_request_model(max_k, max_queries))
    return GuardMiddleware(app, token=token, max_body_bytes=max_body_bytes)


class RetrievalMetrics:
    """The retrieval service's Prometheus metrics, in a registry of their own (one per app)."""

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        self.requests = Counter("agentgym_retrieval_requests", "Retrieve requests served", registry=registry)
        self.queries = Counter("agentgym_retrieval_queries", "Queries answered", registry=registry)
        self.seconds = Histogram("agentgym_retrieval_request_seconds", "Wall time of a retrieve request",
                                 buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5),
                                 registry=registry)
        self.errors = Counter("agentgym_retrieval_errors", "Error responses by error type", ["type"],
                              registry=registry)


class RetrievalService:
    """What the retrieval service's routes share: the index, the largest ``k``, the threads searches run
    in and the metrics.

    The app keeps it as ``app.state.retrieval``; routes reach it through ``Depends(retrieval_service)``.
    """

    def __init__(self, index: Index, *, max_k: int, num_workers: int) -> None:
        self.index, self.max_k = index, max_k
        self.metrics = RetrievalMetrics()
        self.pool = ThreadPoolExecutor(max_workers=num_workers, thread_name_prefix="retrieval")

    async def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """The ``k`` best documents of each query, searched in a worker thread, and counted."""
        started = time.perf_counter()
        results = await asyncio.get_running_loop().run_in_executor(self.pool, self.index.search, queries, k)
        self.metrics.requests.inc()
        self.metrics.queries.inc(len(queries))
        self.metrics.seconds.observe(time.perf_counter() - started)
        return results

    def close(self) -> None:
        """Stop the search threads (searches still queued are cancelled)."""
        self.pool.shutdown(wait=False, cancel_futures=True)


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    yield
    app.state.retrieval.close()


async def retrieval_service(request: Request) -> RetrievalService:
    """The ``RetrievalService`` of the app serving ``request`` (a FastAPI dependency; ``async`` so that
    FastAPI calls it on the event loop, not in a worker thread)."""
    return request.app.state.retrieval


Retrieval = Annotated[RetrievalService, Depends(retrieval_service)]


def _add_routes(app: FastAPI, request_model: type[BaseModel]) -> None:
    """The routes, in the order ``/openapi.json`` lists them.

    Added to the app itself, not through an included ``APIRouter``: recent FastAPI keeps an included
    router as one nested route, and the 405 answer's ``Allow`` reads each route's methods.
    """
    app.post("/retrieve", responses=error_responses(401, 413, 422))(_retrieve_route(request_model))
    app.get("/health")(health)
    app.get("/metrics", response_class=Response, responses={**text_responses("Prometheus text"),
                                                             **error_responses(401)})(metrics)


def _retrieve_route(request_model: type[BaseModel]) -> Callable[..., Awaitable[Response]]:
    """The endpoint of ``POST /retrieve`` for a service whose body model is ``request_model``."""

    async def retrieve(body: Any, service: Retrieval) -> Response:
        results = await service.search(body.queries, body.k)
        return json_response({"results": [[hit.to_dict() for hit in hits] for hits in results]})

    # The body model carries this service's bounds, so it is set as an object: a string annotation
    # would be looked up in the module's globals.
    retrieve.__annotations__ = {"body": request_model, "service": Retrieval, "return": Response}
    return retrieve


async def health(service: Retrieval) -> Response:
    return json_response({"status": "ok", "num_docs": len(service.index), "max_k": service.max_k})


async def metrics(service: Retrieval) -> Response:
    return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def serve_index(index_dir: str | Path, *, host: str = "127.0.0.1", port: int = 8001, token: str | None = None,
                max_k: int = 50, num_workers: int = 4) -> None:
    """Serve an index directory with uvicorn until interrupted (what ``agentgym retrieval serve`` runs)."""
    import uvicorn

    app = create_retrieval_app(index_dir, token=token, max_k=max_k, num_workers=num_workers)
    uvicorn.run(app, host=host, port=port, log_level="warning")
