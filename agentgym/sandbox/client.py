"""``SandboxClient``: the typed client of the sandbox service (``agentgym sandbox serve``).

It needs only ``httpx``, not the ``sandbox`` extra the service needs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import httpx

from agentgym.errors import AgentGymError, RemoteEnvError, SandboxBusy
from agentgym.sandbox.backends import Limits, Result
from agentgym.service_kit.base import STATUS_ERRORS, RetryPolicy, ServiceClient, quoted


class SandboxClient(ServiceClient):
    """Typed client of the sandbox service.

    Raises the classes the service names (``RequestRejected``, ``AuthenticationError``,
    ``SandboxBusy``...); transport failures become ``RemoteEnvError``/``RemoteTimeout``. A run is
    sent again after a transport error only when it never reached the service (see
    ``agentgym.service_kit.base.RetryPolicy``): a program is never run twice by accident.

    Args:
        base_url: the service root (default ``http://127.0.0.1:8100``).
        token: bearer token, if the service has one.
        timeout_s: per-request timeout; give a run's wall-clock limit room.
        transport: an ``httpx`` transport (tests pass ``httpx.MockTransport`` or one over the ASGI app).
        busy_retries: how many times a run the service turned away as busy (503, nothing was run)
            is sent again, each after the service's ``Retry-After``; then ``SandboxBusy``.
        retries: extra attempts after a connection error, or after a failed ``GET``.
        client: an ``httpx.Client`` to use instead of one made here.

    Example:
        >>> def service(request):
        ...     return httpx.Response(200, json=Result("42\\n", "", 0, False, None, 0.01, False).to_dict())
        >>> with SandboxClient(transport=httpx.MockTransport(service)) as sandbox:
        ...     sandbox.run("print(6 * 7)").stdout
        '42\\n'
    """

    default_url = "http://127.0.0.1:8100"
    # A 503 from the sandbox, whatever its body, is the busy answer that ran nothing.
    status_errors: ClassVar[Mapping[int, type[AgentGymError]]] = {**STATUS_ERRORS, 503: SandboxBusy}

    def __init__(self, base_url: str | None = None, *, token: str | None = None, timeout_s: float = 60.0,
                 transport: httpx.BaseTransport | None = None, busy_retries: int = 0, retries: int = 2,
                 client: httpx.Client | None = None) -> None:
        super().__init__(base_url, token=token, timeout_s=timeout_s,
                         retry=RetryPolicy(retries=retries, busy_retries=busy_retries),
                         client=client, transport=transport)

    def run(self, code: str, *, stdin: str = "", limits: Limits | Mapping[str, Any] | None = None) -> Result:
        """Run ``code`` on the service; ``limits`` may be partial (a dict) or a full ``Limits``."""
        body: dict[str, Any] = {"code": code, "stdin": stdin}
        if limits is not None:
            values = dataclasses.asdict(limits) if isinstance(limits, Limits) else dict(limits)
            body["limits"] = {key: value for key, value in values.items() if value is not None}
        answer = self.request("POST", "/run", body)
        try:
            return Result(**answer)
        except TypeError:
            raise RemoteEnvError(f"POST {self.base_url}/run answered something that is not a run result: "
                                 f"{quoted(str(answer))}") from None

    def health(self) -> dict[str, Any]:
        return self.request("GET", "/health")

    def metrics(self) -> str:
        """The service's Prometheus metrics text."""
        return self.send("GET", "/metrics").text
