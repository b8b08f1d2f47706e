"""The client base of every service client: error mapping, safe retries, Retry-After, timeouts.

Against a real FastAPI app: in-process (``TestClient``, ``httpx.ASGITransport``) and over a real
socket (uvicorn on 127.0.0.1). Where a fault cannot be produced by a real server on demand (a
refused connection, an answer lost after the service acted), a transport wraps the real one and
injects it.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

import httpx
import pytest
from conftest import LiveServer
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.testclient import TestClient

from agentgym.errors import (
    AgentGymError,
    AuthenticationError,
    ConfigError,
    RemoteEnvError,
    RemoteTimeout,
    RequestRejected,
    ResetNeeded,
    SandboxBusy,
    SessionCapacityError,
)
from agentgym.http.client import AsyncEnvClient, EnvClient
from agentgym.retrieval.client import RetrievalClient
from agentgym.sandbox.client import SandboxClient
from agentgym.service_kit.base import AsyncServiceClient, RetryPolicy, ServiceClient
from agentgym.service_kit.launcher import free_port

pytestmark = pytest.mark.timeout(60)

JSON, HTML, TEXT = "application/json", "text/html", "text/plain"

#: name -> (status, content type, body) the app answers ``GET /canned/{name}`` with.
CANNED: dict[str, tuple[int, str, bytes]] = {
    "known": (409, JSON, b'{"error": {"type": "ResetNeeded", "message": "call reset first"}}'),
    "capacity": (503, JSON, b'{"error": {"type": "SessionCapacityError", "message": "full"}}'),
    "html-502": (502, HTML, b"<html><body><h1>502 Bad Gateway</h1></body></html>"),
    "text-500": (500, TEXT, b"Internal Server Error"),
    "no-error-key": (500, JSON, b'{"detail": "something broke"}'),
    "error-is-a-string": (409, JSON, b'{"error": "oops"}'),
    "unknown-type": (404, JSON, b'{"error": {"type": "NotFound", "message": "no route /x"}}'),
    "type-not-a-string": (409, JSON, b'{"error": {"type": ["ResetNeeded"], "message": "m"}}'),
    "list-body": (400, JSON, b"[1, 2, 3]"),
    "empty-401": (401, TEXT, b""),
    "html-413": (413, HTML, b"<html>Request Entity Too Large</html>"),
    "text-422": (422, TEXT, b"unprocessable"),
    "text-408": (408, TEXT, b"request timeout"),
    "html-504": (504, HTML, b"<html>Gateway Timeout</html>"),
    "text-503": (503, TEXT, b"no healthy upstream"),
    "ok-not-json": (200, HTML, b"<html>hello</html>"),
}

#: name -> (exception class, fragments its message must contain). ``URL`` stands for the request's URL.
EXPECTED: dict[str, tuple[type[AgentGymError], tuple[str, ...]]] = {
    "known": (ResetNeeded, ("call reset first",)),
    "capacity": (SessionCapacityError, ("full",)),
    "html-502": (RemoteEnvError, ("GET URL answered 502 Bad Gateway", "<h1>502 Bad Gateway</h1>")),
    "text-500": (RemoteEnvError, ("GET URL answered 500", "'Internal Server Error'")),
    "no-error-key": (RemoteEnvError, ("GET URL answered 500", "something broke")),
    "error-is-a-string": (RemoteEnvError, ("GET URL answered 409 Conflict", "oops")),
    "unknown-type": (RemoteEnvError, ("GET URL answered 404 Not Found: NotFound: no route /x",)),
    "type-not-a-string": (RemoteEnvError, ("GET URL answered 409",)),
    "list-body": (RemoteEnvError, ("GET URL answered 400", "[1, 2, 3]")),
    "empty-401": (AuthenticationError, ("GET URL answered 401 Unauthorized",)),
    "html-413": (RequestRejected, ("GET URL answered 413", "Request Entity Too Large")),
    "text-422": (RequestRejected, ("GET URL answered 422", "unprocessable")),
    "text-408": (RemoteTimeout, ("GET URL answered 408",)),
    "html-504": (RemoteTimeout, ("GET URL answered 504", "Gateway Timeout")),
    "text-503": (RemoteEnvError, ("GET URL answered 503 Service Unavailable", "no healthy upstream")),
    "ok-not-json": (RemoteEnvError, ("GET URL answered 200 with a body that is not JSON",
                                     "<html>hello</html>")),
}


def make_app() -> FastAPI:
    """A small service whose routes misbehave on purpose; ``app.state.arrivals[key]`` times each request."""
    app = FastAPI()
    arrivals: dict[str, list[float]] = defaultdict(list)
    app.state.arrivals = arrivals

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/canned/{name}")
    async def canned(name: str) -> Response:
        status, media_type, body = CANNED[name]
        return Response(body, status_code=status, media_type=media_type)

    @app.api_route("/busy/{key}", methods=["GET", "POST", "DELETE"])
    async def busy(key: str, request: Request) -> Response:
        """503 with ``Retry-After: {retry_after}`` on the first request of ``key``, then 200."""
        arrivals[key].append(time.monotonic())
        if len(arrivals[key]) == 1:
            return JSONResponse({"error": {"type": "SessionCapacityError", "message": "full"}},
                                status_code=503, headers={"Retry-After": request.query_params["retry_after"]})
        return JSONResponse({"served": len(arrivals[key])})

    @app.api_route("/count/{key}", methods=["GET", "POST", "DELETE"])
    async def count(key: str, request: Request) -> dict[str, int]:
        """Counts requests, then takes ``sleep_s`` seconds to answer."""
        arrivals[key].append(time.monotonic())
        await asyncio.sleep(float(request.query_params.get("sleep_s", 0)))
        return {"served": len(arrivals[key])}

    return app


# --- error mapping -------------------------------------------------------------------------------


def check_error(exc: BaseException, name: str, url: str) -> None:
    cls, fragments = EXPECTED[name]
    assert type(exc) is cls, (name, exc)
    for fragment in fragments:
        assert fragment.replace("URL", url) in str(exc), (name, str(exc))


def test_error_bodies_map_to_classes_and_garbage_names_url_and_status() -> None:
    with TestClient(make_app()) as http:
        client = ServiceClient(client=http, retry=RetryPolicy(retries=0))
        assert client.base_url == "http://testserver"  # taken from the injected client
        for name in CANNED:
            with pytest.raises(AgentGymError) as info:
                client.request("GET", f"/canned/{name}")
            check_error(info.value, name, f"http://testserver/canned/{name}")


def test_the_async_client_maps_every_answer_the_same_way() -> None:
    async def scenario() -> None:
        transport = httpx.ASGITransport(app=make_app())
        async with AsyncServiceClient("http://svc", transport=transport,
                                      retry=RetryPolicy(retries=0)) as client:
            for name in CANNED:
                with pytest.raises(AgentGymError) as info:
                    await client.request("GET", f"/canned/{name}")
                check_error(info.value, name, f"http://svc/canned/{name}")

    asyncio.run(scenario())


def test_every_service_client_maps_errors_through_the_base() -> None:
    with TestClient(make_app()) as http:
        clients = [EnvClient(client=http, retries=0),
                   RetrievalClient("http://testserver", client=http, retries=0),
                   SandboxClient(client=http, retries=0)]
        for client in clients:
            assert isinstance(client, ServiceClient)
            with pytest.raises(ResetNeeded, match="call reset first"):
                client.request("GET", "/canned/known")
            with pytest.raises(AuthenticationError):
                client.request("GET", "/canned/empty-401")
        # Only the sandbox reads a bare 503 as its busy answer; elsewhere it is a transport-level failure.
        with pytest.raises(SandboxBusy, match="no healthy upstream"):
            clients[2].request("GET", "/canned/text-503")
        for client in clients[:2]:
            with pytest.raises(RemoteEnvError, match="no healthy upstream"):
                client.request("GET", "/canned/text-503")


def test_bad_answers_of_the_typed_clients_name_the_url() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"results": [{"not": "a hit"}]} if request.url.path == "/retrieve"
                              else {"stdout": "no other field"})

    transport = httpx.MockTransport(answer)
    with pytest.raises(RemoteEnvError,
                       match=r"POST http://svc/retrieve answered something that is not a list"):
        RetrievalClient("http://svc", transport=transport).retrieve(["q"])
    with pytest.raises(RemoteEnvError,
                       match=r"POST http://svc/run answered something that is not a run result"):
        SandboxClient("http://svc", transport=transport).run("print(1)")
    batch = httpx.MockTransport(
        lambda request: httpx.Response(200, json={"results": [{"error": "boom"}, 7]}))
    results = EnvClient("http://svc", transport=batch).batch_step([("a", "up"), ("b", "up")])
    assert all(isinstance(item, RemoteEnvError) and "neither a result nor an error" in str(item)
               for item in results)


# --- retries: Retry-After, and never a state-changing request twice -------------------------------


def test_503_retry_after_is_honoured_for_idempotent_requests_only() -> None:
    app = make_app()
    arrivals = app.state.arrivals
    with TestClient(app) as http:
        client = ServiceClient(client=http, retry=RetryPolicy(retries=2))
        assert client.request("GET", "/busy/get?retry_after=1") == {"served": 2}
        assert arrivals["get"][1] - arrivals["get"][0] >= 0.95  # waited the second the service asked for
        with pytest.raises(SessionCapacityError, match="full"):
            client.request("POST", "/busy/post?retry_after=0", {})
        assert len(arrivals["post"]) == 1  # a state-changing request is not resent on 503 ...
        assert client.request("POST", "/busy/marked?retry_after=0", {}, repeatable=True) == {"served": 2}
        busy = ServiceClient(client=http, retry=RetryPolicy(retries=0, busy_retries=1))  # ... unless opted in
        assert busy.request("POST", "/busy/opted?retry_after=0", {}) == {"served": 2}
        # A Retry-After far in the future is cut to max_retry_after_s.
        capped = ServiceClient(client=http, retry=RetryPolicy(max_retry_after_s=0.3))
        started = time.monotonic()
        assert capped.request("GET", "/busy/capped?retry_after=3600") == {"served": 2}
        assert 0.25 <= arrivals["capped"][1] - arrivals["capped"][0] and time.monotonic() - started < 30


def test_async_client_honours_retry_after_too() -> None:
    app = make_app()

    async def scenario() -> None:
        async with AsyncEnvClient("http://svc", transport=httpx.ASGITransport(app=app)) as client:
            assert await client.request("DELETE", "/busy/delete?retry_after=1") == {"served": 2}
            with pytest.raises(SessionCapacityError):
                await client.request("POST", "/busy/post?retry_after=0", {})

    asyncio.run(scenario())
    gap = app.state.arrivals["delete"][1] - app.state.arrivals["delete"][0]
    assert gap >= 0.95 and len(app.state.arrivals["post"]) == 1


class Faulty(httpx.AsyncBaseTransport):
    """Wraps a real transport: refuses the first ``refusals`` connections, or loses every answer
    after the service has handled the request (``lose_answers``)."""

    def __init__(self, inner: httpx.AsyncBaseTransport, refusals: int = 0,
                 lose_answers: bool = False) -> None:
        self.inner, self.refusals, self.lose_answers = inner, refusals, lose_answers

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.refusals:
            self.refusals -= 1
            raise httpx.ConnectError("connection refused", request=request)
        response = await self.inner.handle_async_request(request)
        if self.lose_answers:
            await response.aclose()
            raise httpx.ReadError("connection reset by peer", request=request)
        return response


def test_a_sent_post_is_never_repeated_but_a_refused_connection_is() -> None:
    app = make_app()
    arrivals = app.state.arrivals
    retry = RetryPolicy(retries=2, backoff_s=0.01)

    async def scenario() -> None:
        lossy = Faulty(httpx.ASGITransport(app=app), lose_answers=True)
        async with AsyncServiceClient("http://svc", transport=lossy, retry=retry) as client:
            with pytest.raises(RemoteEnvError, match="POST http://svc/count/step failed: ReadError") as info:
                await client.request("POST", "/count/step", {"action": "up"})
            assert type(info.value) is RemoteEnvError and isinstance(info.value.__cause__, httpx.ReadError)
            with pytest.raises(RemoteEnvError, match=r"ReadError.*after 3 attempts"):
                await client.request("GET", "/count/read")
        refusing = Faulty(httpx.ASGITransport(app=app), refusals=2)
        async with AsyncServiceClient("http://svc", transport=refusing, retry=retry) as client:
            assert await client.request("POST", "/count/refused", {"action": "up"}) == {"served": 1}

    asyncio.run(scenario())
    assert len(arrivals["step"]) == 1  # the service handled the step once: it was not sent again
    assert len(arrivals["read"]) == 3  # a GET is: 1 + retries
    assert len(arrivals["refused"]) == 1  # two refused connections, then one delivery


# --- over a real socket ----------------------------------------------------------------------------


class CountingTransport(httpx.HTTPTransport):
    """The real HTTP transport, counting the requests handed to it."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.attempts += 1
        return super().handle_request(request)


def test_timeouts_and_connection_errors_over_a_real_socket() -> None:
    app = make_app()
    arrivals = app.state.arrivals
    server = LiveServer(app)
    try:
        retry = RetryPolicy(retries=2, backoff_s=0.01)
        with ServiceClient(server.url, timeout_s=0.3, retry=retry) as client:
            with pytest.raises(RemoteTimeout, match="POST .*/count/slow-post.* timed out on the client side"):
                client.request("POST", "/count/slow-post?sleep_s=1.5", {})
            assert len(arrivals["slow-post"]) == 1  # sent, so never again: the service may be acting on it
            with pytest.raises(RemoteTimeout, match="after 3 attempts"):
                client.request("GET", "/count/slow-get?sleep_s=1.5")
            assert len(arrivals["slow-get"]) == 3
            assert client.request("POST", "/count/fast", {}) == {"served": 1}
    finally:
        server.stop()
    # Nothing listens on this port: the connection is refused before anything is sent, so even a
    # POST is tried again, 1 + retries times, then reported with the cause.
    transport = CountingTransport()
    refused = r"POST http://127\.0\.0\.1:\d+/sessions failed: ConnectError"
    with (ServiceClient(f"http://127.0.0.1:{free_port()}", transport=transport, retry=retry) as client,
          pytest.raises(RemoteEnvError, match=refused)):
        client.request("POST", "/sessions", {"env_id": "maze-v0"})
    assert transport.attempts == 3


# --- construction ----------------------------------------------------------------------------------


def test_bad_arguments_name_what_to_fix() -> None:
    for kwargs, fragment in [({"base_url": "127.0.0.1:8000"}, "base_url must be an http:// or https:// URL"),
                             ({"base_url": "http://x", "timeout_s": 0},
                              "timeout_s must be a positive number"),
                             ({"base_url": "http://x", "client": httpx.Client(),
                               "transport": httpx.HTTPTransport()},
                              "either client= or transport=")]:
        with pytest.raises(ConfigError, match=fragment):
            ServiceClient(**kwargs)
    with pytest.raises(ConfigError, match="base_url must be"):
        ServiceClient()  # the base has no default URL; the service clients do
    with pytest.raises(ConfigError, match="retries must be a non-negative integer"):
        EnvClient(retries=-1)
    with pytest.raises(ConfigError, match="busy_retries"):
        SandboxClient(busy_retries=1.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_retry_after_s"):
        RetryPolicy(max_retry_after_s=float("inf"))


def test_token_is_sent_per_request_and_an_injected_client_is_left_as_it_was() -> None:
    seen: list[str | None] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(200, json={})

    shared = httpx.Client(transport=httpx.MockTransport(answer), base_url="http://svc")
    EnvClient(client=shared, token="tok").health()
    EnvClient(client=shared).health()
    assert seen == ["Bearer tok", None] and "authorization" not in shared.headers
    client = EnvClient(client=shared)
    client.close()  # an injected client is the caller's to close
    assert not shared.is_closed
    shared.close()


def test_default_urls_and_trailing_slashes() -> None:
    assert EnvClient().base_url == "http://127.0.0.1:8000" and SandboxClient().base_url == "http://127.0.0.1:8100"
    assert RetrievalClient("http://svc:8001/").url == "http://svc:8001"
