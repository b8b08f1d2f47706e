"""The client base of every agentgym service client: ``ServiceClient``, ``AsyncServiceClient`` and their
``RetryPolicy``.

``EnvClient`` / ``AsyncEnvClient`` (env service), ``SandboxClient`` and ``RetrievalClient`` subclass
these and add only their routes. What they share lives here, once:

- **Errors.** Every service answers an error with ``{"error": {"type", "message"}}``; the client
  raises the ``agentgym.errors`` class of that name with the service's message, so a remote env
  raises what a local one does. Any other error answer (a proxy's HTML page, garbage, a ``type``
  no agentgym class has) falls back on the status (``STATUS_ERRORS``: 401, 408, 413, 422, 504;
  a client may add its own, as the sandbox's 503) and else ``RemoteEnvError``; its message names
  the method, URL, status and the start of the body. A success body that is not JSON raises
  ``RemoteEnvError`` too. The classes and which failure raises which: ``agentgym.errors``.
- **Retries** only where they cannot do a thing twice: ``RetryPolicy``.
- **Connection.** Base URL, bearer token, timeout and connection limits; or an ``httpx`` client
  (FastAPI's ``TestClient``) or transport (``httpx.ASGITransport``, ``httpx.MockTransport``)
  passed in, so a client can be tested against the real app without sockets.

The sync and async clients run the same three-step loop (send; ask the policy whether and when to
send again; else turn the outcome into a result or an exception); every decision in it is the
policy's or the base's, so the two cannot drift apart.
"""

from __future__ import annotations

import asyncio
import email.utils
import itertools
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, ClassVar

import httpx

from agentgym.errors import (
    ERRORS_BY_NAME,
    AgentGymError,
    AuthenticationError,
    ConfigError,
    RemoteEnvError,
    RemoteTimeout,
    RequestRejected,
)

if TYPE_CHECKING:
    from typing_extensions import Self

#: Methods that do no harm when a request reaches the service twice (RFC 9110, section 9.2.2).
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
#: Transport errors raised before the request left the client: sending again cannot do a thing twice.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
#: The error class of an error answer whose body names none, by status.
STATUS_ERRORS: Mapping[int, type[AgentGymError]] = {
    401: AuthenticationError, 408: RemoteTimeout, 413: RequestRejected, 422: RequestRejected,
    504: RemoteTimeout,
}
#: Parsed URLs a client keeps (its sessions' routes; beyond this it starts over).
_PARSED_URLS_KEPT = 8192
#: How much of an unexpected body an error message quotes.
_QUOTED_CHARS = 200


@dataclass(frozen=True)
class RetryPolicy:
    """When a client sends a request again, and how long it waits first.

    A request is *repeatable* when receiving it twice does no harm: the methods in
    ``IDEMPOTENT_METHODS`` (GET, DELETE...), or one a caller marks ``repeatable=True`` (a search).

    - A transport error before the request left the client (``NOT_SENT``: connect error or
      timeout, pool timeout): sent again whatever the method, up to ``retries`` times.
    - Any other transport error (read timeout, dropped connection): the service may have acted on
      it, so only a repeatable request is sent again — a step never runs twice.
    - An answer of 503: a repeatable request is sent again up to ``retries`` times; any request up
      to ``busy_retries`` times, which a client sets only for a service whose 503 promises that
      nothing was done (the sandbox turns a run away before starting it).
    - Any other answer is final.

    Before sending again it waits the 503's ``Retry-After`` (seconds or an HTTP date, at most
    ``max_retry_after_s``), else ``backoff_s * 2**attempt`` (at most ``max_backoff_s``).

    Example:
        >>> policy = RetryPolicy(retries=2)
        >>> policy.delay(httpx.ConnectError("refused"), attempt=0, repeatable=False)  # never sent
        0.1
        >>> print(policy.delay(httpx.ReadTimeout("slow"), attempt=0, repeatable=False))  # a step may have run
        None
        >>> policy.delay(httpx.Response(503, headers={"Retry-After": "3"}), attempt=1, repeatable=True)
        3.0
        >>> print(policy.delay(httpx.Response(503), attempt=0, repeatable=False))  # busy_retries=0
        None
    """

    retries: int = 2
    """Extra attempts after a transport error or a 503, for a request the rules above allow."""
    busy_retries: int = 0
    """Extra attempts of any request the service answered 503; only where 503 means nothing was done."""
    backoff_s: float = 0.1
    """Wait before the first extra attempt when the service named none; doubles each attempt."""
    max_backoff_s: float = 2.0
    """Longest backoff wait."""
    max_retry_after_s: float = 10.0
    """Longest wait a ``Retry-After`` header can ask for (a longer one is cut to this)."""

    def __post_init__(self) -> None:
        for name in ("retries", "busy_retries"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name} must be a non-negative integer, got {value!r}")
        for name in ("backoff_s", "max_backoff_s", "max_retry_after_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise ConfigError(f"{name} must be a non-negative number of seconds, got {value!r}")

    def delay(self, outcome: httpx.Response | httpx.HTTPError, attempt: int,
              repeatable: bool) -> float | None:
        """Seconds to wait before sending again after ``outcome``, or ``None`` when it is final.

        Args:
            outcome: the answer of attempt number ``attempt`` (0 for the first), or its transport error.
            attempt: how many attempts came before this one.
            repeatable: whether the request does no harm when the service receives it twice.
        """
        if isinstance(outcome, httpx.HTTPError):
            if attempt >= self.retries or not (repeatable or isinstance(outcome, NOT_SENT)):
                return None
            return self.backoff(attempt)
        if outcome.status_code != 503 or attempt >= max(self.busy_retries, self.retries if repeatable else 0):
            return None
        return self.retry_after_s(outcome, attempt)

    def backoff(self, attempt: int) -> float:
        """The wait after attempt ``attempt`` failed without the service naming one."""
        return float(min(self.backoff_s * 2**attempt, self.max_backoff_s))

    def retry_after_s(self, response: httpx.Response, attempt: int) -> float:
        """The wait a 503 asks for in ``Retry-After`` (bounded), else the backoff.

        Example:
            >>> policy = RetryPolicy(max_retry_after_s=5)
            >>> [policy.retry_after_s(httpx.Response(503, headers={"Retry-After": value}), 0)
            ...  for value in ("2", "3600", "-1", "soon", "Wed, 21 Oct 2015 07:28:00 GMT")]
            [2.0, 5.0, 0.0, 0.1, 0.0]
        """
        value = response.headers.get("Retry-After")
        if value is None:
            return self.backoff(attempt)
        try:
            seconds = float(value)
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError, IndexError):
                return self.backoff(attempt)
            if when.tzinfo is None:
                when = when.replace(tzinfo=timezone.utc)
            seconds = (when - datetime.now(timezone.utc)).total_seconds()
        if math.isnan(seconds):
            return self.backoff(attempt)
        return float(min(max(seconds, 0.0), self.max_retry_after_s))


def quoted(text: str) -> str:
    """The start of an unexpected body, for an error message."""
    return repr(text[:_QUOTED_CHARS] + ("..." if len(text) > _QUOTED_CHARS else ""))


def error_from_detail(detail: Any) -> AgentGymError | None:
    """The exception an error body's ``{"type", "message"}`` names, or ``None`` when it names none.

    Example:
        >>> error_from_detail({"type": "ResetNeeded", "message": "call reset first"})
        ResetNeeded('call reset first')
        >>> print(error_from_detail({"type": "KeyError", "message": "m"}))  # not an agentgym class
        None
    """
    if not isinstance(detail, Mapping) or not isinstance(detail.get("message"), str):
        return None
    kind = detail.get("type")
    cls = ERRORS_BY_NAME.get(kind) if isinstance(kind, str) else None
    return cls(detail["message"]) if cls is not None else None


def error_for_response(response: httpx.Response, method: str, url: str,
                       status_errors: Mapping[int, type[AgentGymError]] = STATUS_ERRORS) -> AgentGymError:
    """The exception an error answer (status >= 400) stands for; see the module docstring.

    Example:
        >>> answer = httpx.Response(502, text="<html>Bad Gateway</html>")
        >>> error_for_response(answer, "GET", "http://svc/health")  # doctest: +NORMALIZE_WHITESPACE
        RemoteEnvError("GET http://svc/health answered 502 Bad Gateway,
                        not an agentgym error body: '<html>Bad Gateway</html>'")
    """
    status = f"{response.status_code} {response.reason_phrase}".rstrip()
    try:
        detail = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        detail = None
    error = error_from_detail(detail)
    if error is not None:
        return error
    cls = status_errors.get(response.status_code, RemoteEnvError)
    if isinstance(detail, Mapping) and "type" in detail:
        return cls(f"{method} {url} answered {status}: {detail.get('type')}: {detail.get('message')}")
    return cls(f"{method} {url} answered {status}, not an agentgym error body: {quoted(response.text)}")


def transport_error(exc: httpx.HTTPError, method: str, url: str, attempts: int) -> RemoteEnvError:
    """The agentgym exception for an ``httpx`` transport failure (raise it ``from exc``)."""
    tries = f" (after {attempts} attempts)" if attempts > 1 else ""
    if isinstance(exc, httpx.TimeoutException):
        return RemoteTimeout(f"{method} {url} timed out on the client side: {type(exc).__name__}{tries}")
    return RemoteEnvError(f"{method} {url} failed: {type(exc).__name__}: {exc}{tries}")


def json_body(response: httpx.Response) -> Any:
    """A success answer's JSON (``None`` for 204 No Content).

    Raises:
        RemoteEnvError: the body is not JSON (the message names the URL, status and the body's start).
    """
    if response.status_code == 204:
        return None
    try:
        return response.json()
    except ValueError:
        request = response.request
        raise RemoteEnvError(f"{request.method} {request.url} answered {response.status_code} with a body "
                             f"that is not JSON: {quoted(response.text)}") from None


def _no_cookies(response: httpx.Response) -> None:
    """Stands in for ``httpx.Cookies.extract_cookies`` on the clients made here (see ``_Endpoint``)."""


class _Endpoint:
    """What the sync and async clients share: where requests go, with which token, under which policy.

    The arguments are documented on ``ServiceClient``; ``AsyncServiceClient`` takes the async
    ``httpx`` client and transport types.
    """

    #: The URL a subclass talks to when given none (``None``: a URL is required).
    default_url: ClassVar[str | None] = None
    #: Error class by status for error answers whose body names none (a subclass may add its own).
    status_errors: ClassVar[Mapping[int, type[AgentGymError]]] = STATUS_ERRORS
    #: The ``httpx`` client class made when none is injected.
    _http_class: ClassVar[type[httpx.Client | httpx.AsyncClient]]

    def __init__(self, base_url: str | None = None, *, token: str | None = None, timeout_s: float = 60.0,
                 retry: RetryPolicy | None = None, limits: httpx.Limits | None = None,
                 client: httpx.Client | httpx.AsyncClient | None = None,
                 transport: httpx.BaseTransport | httpx.AsyncBaseTransport | None = None) -> None:
        if client is not None and transport is not None:
            raise ConfigError("pass either client= or transport=, not both "
                              "(a client brings its own transport)")
        if (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                or not 0 < timeout_s < math.inf):
            raise ConfigError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        if base_url is None and client is not None and str(client.base_url):
            base_url = str(client.base_url)
        base_url = base_url if base_url is not None else self.default_url
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"base_url must be an http:// or https:// URL, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.retry = retry or RetryPolicy()
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}
        self._owns_client = client is None
        limits = limits or httpx.Limits()
        if client is None and transport is None:
            transport = self._default_transport(self.base_url, limits)
        self._http: Any = client if client is not None else self._http_class(
            timeout=timeout_s, limits=limits, transport=transport)  # type: ignore[arg-type]
        self._parsed_urls: dict[str, httpx.URL] = {}
        if client is None:
            # agentgym services set no cookies, and reading them off every answer is a third of
            # httpx's own per-request cost (it rebuilds urllib and email objects per response).
            self._http.cookies.extract_cookies = _no_cookies

    @staticmethod
    def _default_transport(base_url: str, limits: httpx.Limits) -> Any:
        """The transport of the client made here when none is injected (None: httpx's own)."""
        return None

    def _parsed(self, url: str) -> httpx.URL | str:
        """``url`` parsed once: a session's step URL repeats every turn, and parsing it is ~15 µs."""
        if not self._owns_client:  # an injected client may be another httpx (Starlette's TestClient)
            return url  # type: ignore[return-value]
        parsed = self._parsed_urls.get(url)
        if parsed is None:
            if len(self._parsed_urls) >= _PARSED_URLS_KEPT:
                self._parsed_urls.clear()
            parsed = self._parsed_urls[url] = httpx.URL(url)
        return parsed

    def _start(self, method: str, path: str, repeatable: bool | None) -> tuple[str, str, bool]:
        method = method.upper()
        return (method, f"{self.base_url}{path}",
                method in IDEMPOTENT_METHODS if repeatable is None else repeatable)

    def _checked(self, outcome: httpx.Response | httpx.HTTPError, method: str, url: str, attempts: int
                ) -> httpx.Response:
        """The final ``outcome`` as a success answer, or the agentgym exception it stands for."""
        if isinstance(outcome, httpx.HTTPError):
            raise transport_error(outcome, method, url, attempts) from outcome
        if outcome.status_code >= 400:
            raise error_for_response(outcome, method, url, self.status_errors)
        return outcome


class ServiceClient(_Endpoint):
    """Synchronous client base: one service, its errors mapped and its retries safe.

    Args:
        base_url: the service root, e.g. ``"http://127.0.0.1:8000"``; ``None``: the injected
            ``client``'s base URL, else the subclass's ``default_url``.
        token: bearer token, if the service was started with one.
        timeout_s: per-request timeout (connect, read, write, pool) of the client made here.
        retry: when to send again (default ``RetryPolicy()``).
        limits: connection pool limits of the client made here.
        client: an ``httpx.Client`` to use instead (tests pass FastAPI's ``TestClient``); it keeps
            its own timeout and limits, and is not closed by ``close``.
        transport: an ``httpx`` transport for the client made here (``httpx.MockTransport``...).

    Raises:
        ConfigError: a URL that is not http(s), a non-positive timeout, both ``client`` and ``transport``.

    Example:
        >>> answer = httpx.MockTransport(lambda request: httpx.Response(200, json={"path": request.url.path}))
        >>> with ServiceClient("http://svc", transport=answer) as service:
        ...     service.request("GET", "/health")
        {'path': '/health'}
    """

    _http_class = httpx.Client

    def send(self, method: str, path: str, json: Any = None, *,
             repeatable: bool | None = None) -> httpx.Response:
        """Send a request, again where ``self.retry`` allows; return the success answer.

        Args:
            method: HTTP method.
            path: path below the base URL, starting with ``/``.
            json: the JSON body, if any.
            repeatable: the request does no harm when received twice (default: its method is idempotent).

        Raises:
            AgentGymError: the class the service's error body names, or the status's fallback.
            RemoteEnvError: a transport failure (``RemoteTimeout`` for a timeout).
        """
        method, url, repeatable = self._start(method, path, repeatable)
        for attempt in itertools.count():
            try:
                outcome: httpx.Response | httpx.HTTPError = self._http.request(
                    method, self._parsed(url), json=json, headers=self._auth)
            except httpx.HTTPError as exc:
                outcome = exc
            delay = self.retry.delay(outcome, attempt, repeatable)
            if delay is None:
                return self._checked(outcome, method, url, attempt + 1)
            time.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    def request(self, method: str, path: str, json: Any = None, *, repeatable: bool | None = None) -> Any:
        """``send``, returning the answer's JSON (``None`` for 204); a body that is not JSON raises
        ``RemoteEnvError``."""
        return json_body(self.send(method, path, json, repeatable=repeatable))

    def close(self) -> None:
        """Close the connection pool (not an injected client's)."""
        if self._owns_client:
            self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncServiceClient(_Endpoint):
    """Asynchronous twin of ``ServiceClient``: the same arguments (an ``httpx.AsyncClient`` or async
    transport injected), the same methods awaited.

    Example:
        >>> answer = httpx.MockTransport(lambda request: httpx.Response(200, json={"method": request.method}))
        >>> async def main():
        ...     async with AsyncServiceClient("http://svc", transport=answer) as service:
        ...         return await service.request("DELETE", "/sessions/s1")
        >>> asyncio.run(main())
        {'method': 'DELETE'}
    """

    _http_class = httpx.AsyncClient

    @staticmethod
    def _default_transport(base_url: str, limits: httpx.Limits) -> Any:
        # httpx's own async transport costs ~1 ms of CPU per request, ten times a step on the
        # service; plain-http services get the lean one (same httpx API, errors and limits).
        if base_url.startswith("http://"):
            from agentgym.service_kit.transport import LeanAsyncTransport

            return LeanAsyncTransport.from_limits(limits)
        return None

    async def send(self, method: str, path: str, json: Any = None, *, repeatable: bool | None = None
                   ) -> httpx.Response:
        """See ``ServiceClient.send``."""
        method, url, repeatable = self._start(method, path, repeatable)
        for attempt in itertools.count():
            try:
                outcome: httpx.Response | httpx.HTTPError = await self._http.request(
                    method, self._parsed(url), json=json, headers=self._auth)
            except httpx.HTTPError as exc:
                outcome = exc
            delay = self.retry.delay(outcome, attempt, repeatable)
            if delay is None:
                return self._checked(outcome, method, url, attempt + 1)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    async def request(self, method: str, path: str, json: Any = None, *,
                      repeatable: bool | None = None) -> Any:
        """See ``ServiceClient.request``."""
        return json_body(await self.send(method, path, json, repeatable=repeatable))

    async def aclose(self) -> None:
        """Close the connection pool (not an injected client's)."""
        if self._owns_client:
            await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
