"""The code sandbox: run untrusted Python outside the caller's process, under limits.

``run_code`` with a ``Limits`` gives a ``Result``; backends are ``BwrapBackend`` (the default when
it works here), ``DockerBackend`` (when a Docker engine answers) and ``SubprocessBackend`` (opt-in,
NOT a security boundary). ``WarmPool`` hides start-up latency; ``agentgym.sandbox.service`` serves
it all over HTTP, ``agentgym.sandbox.client`` talks to that service; ``agentgym.sandbox.audit``
checks which attacks a backend stops.
"""

from __future__ import annotations

from agentgym.sandbox.backends import (
    Backend,
    BwrapBackend,
    DockerBackend,
    Limits,
    Result,
    SubprocessBackend,
    default_backend,
    run_code,
)
from agentgym.sandbox.pool import WarmPool

__all__ = [
    "Backend", "BwrapBackend", "DockerBackend", "Limits", "Result", "SubprocessBackend", "WarmPool",
    "default_backend", "run_code",
]
