"""``RetrievalClient``: the client of a retrieval service, a ``Retriever`` like a local ``Index``.

It needs only ``httpx``, not the ``server`` extra the service needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from agentgym.errors import RemoteEnvError
from agentgym.retrieval.index import Hit
from agentgym.service_kit.base import RetryPolicy, ServiceClient, quoted


class RetrievalClient(ServiceClient):
    """Client of a retrieval service (``agentgym retrieval serve``); ``search`` as on a local ``Index``.

    A retrieval changes nothing on the service, so ``POST /retrieve`` is sent again like a ``GET``
    (``agentgym.service_kit.base.RetryPolicy``, ``retries`` extra attempts) after a connection error, a
    transport error or a 503. Service errors raise the agentgym exception the service named
    (``RequestRejected`` for 413/422, ``AuthenticationError`` for 401), transport failures
    ``RemoteEnvError`` / ``RemoteTimeout``.

    Args:
        url: the service root, e.g. ``"http://127.0.0.1:8001"``.
        token: bearer token, if the service has one.
        timeout_s: per-request timeout.
        retries: extra attempts (see above).
        client: an ``httpx.Client`` to use instead (tests pass FastAPI's ``TestClient``).
        transport: an ``httpx`` transport for the client made here.

    Example:
        >>> def service(request):
        ...     hit = {"id": "d1", "title": "Ostavia", "text": "A country.", "score": 1.5}
        ...     return httpx.Response(200, json={"results": [[hit]]})
        >>> with RetrievalClient("http://retrieval", transport=httpx.MockTransport(service)) as client:
        ...     client.search(["Ostavia"], k=1)[0][0].title
        'Ostavia'
    """

    def __init__(self, url: str, *, token: str | None = None, timeout_s: float = 30.0, retries: int = 2,
                 client: httpx.Client | None = None, transport: httpx.BaseTransport | None = None) -> None:
        super().__init__(url, token=token, timeout_s=timeout_s, retry=RetryPolicy(retries=retries),
                         client=client, transport=transport)

    @property
    def url(self) -> str:
        """The service root (no trailing slash)."""
        return self.base_url

    def retrieve(self, queries: Sequence[str], k: int = 3) -> list[list[Hit]]:
        """The top ``k`` hits for each query, best first (one request)."""
        payload = self.request("POST", "/retrieve", {"queries": list(queries), "k": k}, repeatable=True)
        try:
            return [[Hit(**hit) for hit in hits] for hits in payload["results"]]
        except (TypeError, KeyError):
            raise RemoteEnvError(f"POST {self.base_url}/retrieve answered something that is not a list of "
                                 f"hits per query: {quoted(str(payload))}") from None

    search = retrieve

    def health(self) -> dict[str, Any]:
        return self.request("GET", "/health")
