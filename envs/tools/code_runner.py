"""``CodeRunner``: how the code envs reach the sandbox (a per-process warm pool or a sandbox service).

Both ``code-math-v0`` and ``code-tests-v0`` run model-written Python through one ``CodeRunner``:
in-process through a ``WarmPool`` shared by every env of the process (``default_backend()``:
bubblewrap here), or remotely through ``agentgym sandbox serve`` with ``sandbox_url=``. Also
``describe_result``, which turns a ``Result`` into text a model can read.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import threading
from collections.abc import Mapping
from typing import Any

from agentgym.errors import ConfigError
from agentgym.sandbox import Limits, Result, WarmPool, default_backend

#: Idle warm workers kept per process and backend (a run with none ready spawns one: ~40 ms).
POOL_SIZE = 2
#: Attempts on a sandbox service that answers 503 (busy) before the env gives up and raises.
BUSY_ATTEMPTS = 8
#: Environment variables that give ``sandbox_url`` / ``sandbox_token`` when the env is made without
#: them (an env service in a container reaches the sandbox container this way; see services/).
URL_ENV_VAR, TOKEN_ENV_VAR = "AGENTGYM_SANDBOX_URL", "AGENTGYM_SANDBOX_TOKEN"

_pools: dict[tuple[int, str], WarmPool] = {}
_clients: dict[tuple[int, str, str | None], Any] = {}
_shared_lock = threading.Lock()


def _shared_pool(backend: str) -> WarmPool:
    """The process's warm pool for ``backend``; a forked child builds its own (threads do not fork)."""
    key = (os.getpid(), backend)
    with _shared_lock:
        pool = _pools.get(key)
        if pool is None:
            pool = _pools[key] = WarmPool(default_backend(backend), size=POOL_SIZE)  # type: ignore[arg-type]
        return pool


def _shared_client(url: str, token: str | None) -> Any:
    from agentgym.sandbox.client import SandboxClient

    key = (os.getpid(), url, token)
    with _shared_lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = SandboxClient(url, token=token, busy_retries=BUSY_ATTEMPTS - 1)
        return client


@atexit.register
def _close_shared() -> None:
    with _shared_lock:
        pools, clients = [p for (pid, _), p in _pools.items() if pid == os.getpid()], list(_clients.values())
        _pools.clear()
        _clients.clear()
    for pool in pools:
        pool.close()  # kills idle workers and removes their scratch dirs
    for client in clients:
        client.close()


def make_limits(limits: Limits | Mapping[str, Any] | None, default: Limits) -> Limits:
    """``limits`` as a ``Limits``: a full ``Limits``, or a mapping of fields overriding ``default``.

    Raises:
        ConfigError: an unknown field or a value out of range (the message names it).

    Example:
        >>> make_limits({"wall_clock_s": 2}, Limits(memory_mb=256)).memory_mb
        256
        >>> make_limits({"wall": 2}, Limits())  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        agentgym.errors.ConfigError: unknown sandbox limit 'wall'; choose from wall_clock_s, cpu_s, ...
    """
    if limits is None:
        return default
    if isinstance(limits, Limits):
        return limits
    if not isinstance(limits, Mapping):
        raise ConfigError(f"limits must be a sandbox Limits or a dict of its fields, got {limits!r}")
    names = [item.name for item in dataclasses.fields(Limits)]
    for key in limits:
        if key not in names:
            raise ConfigError(f"unknown sandbox limit {key!r}; choose from {', '.join(names)}")
    return dataclasses.replace(default, **dict(limits))


class CodeRunner:
    """Runs one program per call in the sandbox and returns its ``Result``.

    Args:
        limits: the limits of every run.
        sandbox_url: URL of a sandbox service (``agentgym sandbox serve``); ``None``: the
            ``AGENTGYM_SANDBOX_URL`` environment variable when set, else in-process on the process's
            shared warm pool.
        sandbox_token: bearer token of that service (``None``: ``AGENTGYM_SANDBOX_TOKEN`` if set).
        backend: in-process backend name (``"auto"``: bwrap, else docker; ``"subprocess"`` is the
            opt-in, NOT secure one). Ignored with ``sandbox_url``.

    Raises:
        ConfigError: no usable in-process backend (the message says what to install).

    Whatever the code does (loops forever, crashes, floods the output, tries to get out) comes back
    as a ``Result``. What does raise is the sandbox itself failing: an unreachable service
    (``RemoteEnvError``), limits over the service's maxima (``RequestRejected``), or a service
    still busy after ``BUSY_ATTEMPTS`` tries (``SandboxBusy``) — an observation made up in their
    place would break determinism and mislead training.
    """

    def __init__(self, limits: Limits, *, sandbox_url: str | None = None, sandbox_token: str | None = None,
                 backend: str = "auto") -> None:
        self.limits = limits
        sandbox_url = sandbox_url if sandbox_url is not None else (os.environ.get(URL_ENV_VAR) or None)
        sandbox_token = (sandbox_token if sandbox_token is not None
                         else (os.environ.get(TOKEN_ENV_VAR) or None))
        self.sandbox_url = sandbox_url
        if sandbox_url is not None:
            if not isinstance(sandbox_url, str) or not sandbox_url.startswith(("http://", "https://")):
                raise ConfigError(f"sandbox_url must be an http(s) URL of a sandbox service, "
                                  f"got {sandbox_url!r}")
            self._client = _shared_client(sandbox_url, sandbox_token)
            self._pool = None
        else:
            self._client = None
            self._pool = _shared_pool(backend)

    def run(self, code: str) -> Result:
        """Run ``code`` as a fresh ``__main__`` under ``self.limits``."""
        if self._pool is not None:
            return self._pool.run(code, "", self.limits)
        return self._client.run(code, limits=self.limits)


def cut(text: str, max_chars: int) -> str:
    """``text`` shortened to ``max_chars`` characters from both ends, saying how much was left out.

    Both ends, because a program's first lines say what it did and its last ones how it ended
    (a traceback ends with the exception).

    Example:
        >>> cut("abcdefghij", 4)
        'ab\\n[... 6 characters not shown ...]\\nij'
    """
    if len(text) <= max_chars:
        return text
    head = max_chars - max_chars // 2
    tail = max_chars - head
    return f"{text[:head]}\n[... {len(text) - max_chars} characters not shown ...]\n{text[len(text) - tail:]}"


def describe_end(result: Result, limits: Limits) -> str:
    """One line on how a run was cut short, or ``""`` when it ended by itself.

    Uses the limits, never the measured time, so the text is the same every time the code runs.

    Example:
        >>> r = Result("", "", None, True, "wall_clock", 5.01, False)
        >>> describe_end(r, Limits(wall_clock_s=5))
        '[stopped: the run took longer than 5 s]'
    """
    reason = result.killed_reason
    if reason == "wall_clock":
        return f"[stopped: the run took longer than {limits.wall_clock_s:g} s]"
    if reason == "output_limit":
        return f"[stopped: the output went past {limits.output_bytes} bytes]"
    if reason == "cpu":
        return f"[stopped: the run used more than {limits.cpu_limit_s} s of CPU time]"
    if reason == "signal":
        return f"[stopped: the program was killed by signal {-(result.exit_code or 0)}]"
    return ""
