"""The exception hierarchy: every error agentgym raises on purpose.

    AgentGymError
    ├── RegistryError
    │   ├── UnknownEnv            no env registered under that id (suggests the nearest ids)
    │   ├── DuplicateEnv          an id registered twice without ``override=True``
    │   ├── VersionNotFound       the name exists, that version does not (lists the versions)
    │   └── UnknownPlugin         a setting names no registered backend or decoding constraint;
    │                             also a ``ConfigError`` (suggests the nearest names, lists all)
    ├── EnvContractError          an env broke the text-env contract (see ``agentgym.core.Env``)
    │   ├── ResetNeeded           ``step``/``fork`` before the first ``reset``
    │   ├── EpisodeFinished       ``step`` after ``terminated`` or ``truncated``
    │   └── CheckFailed           ``check_env`` found a broken rule (``.rule`` names its check)
    ├── EnvCrashed                env code raised inside ``reset``/``step``; the episode is lost
    ├── SessionError              HTTP service session problems
    │   ├── UnknownSession        no such session id (never created, closed or reaped)
    │   ├── SessionLost           its env died with the worker process that held it (HTTP 410)
    │   └── SessionCapacityError  the service is at ``max_sessions`` (HTTP 503, retry later)
    │       └── SandboxBusy       the sandbox service runs ``max_concurrency`` programs (HTTP 503)
    ├── RemoteEnvError            talking to a service failed (HTTP 502 on a service); raised for:
    │   │                           * an ``httpx.HTTPError`` that is not a timeout (connection
    │   │                             refused, reset, protocol error), wrapped as ``__cause__``
    │   │                           * an answer that is not the services' error body (a proxy's
    │   │                             HTML page, garbage, an unknown ``type``) or not JSON at all
    │   ├── RemoteTimeout         a deadline passed: ``httpx.TimeoutException`` on the client side
    │   │                         (connect, read, write, pool), or HTTP 504 / 408 from the service
    │   ├── RequestRejected       the service refused the request as malformed (HTTP 413 / 422)
    │   └── AuthenticationError   missing or wrong bearer token (HTTP 401)
    ├── JudgeError                a reward judge gave no usable score after its retries (``agentgym.judge``)
    └── ConfigError               a config or argument value is invalid; names the field to fix

A remote env raises the same classes a local env does: the service sends ``{"error": {"type":
"ResetNeeded", "message": ...}}`` and the client maps ``type`` back to the class with that name
(``agentgym.service_kit.base`` says how, and when a request is sent again).

The ``agentgym`` command exits with the status the class says (``exit_status``): 2 for a usage error,
the command as typed cannot run (``ConfigError``, ``RegistryError``: a bad option or ``--set`` value,
an invalid config, an unknown id, a missing file the user named); 1 for a runtime failure, the
command was right and something it ran failed (every other class: an env broke the contract or
crashed, a service could not be reached, a judge gave no score); 130 for Ctrl-C.
"""

from __future__ import annotations

#: Exit status of a usage error: the command as typed cannot run (click's own, for a bad option).
USAGE_EXIT_STATUS = 2
#: Exit status of a command stopped by Ctrl-C: 128 + SIGINT, as shells report a process the signal ended.
INTERRUPTED_EXIT_STATUS = 130


class AgentGymError(Exception):
    """Base class of every error agentgym raises on purpose."""

    #: HTTP status the service answers with when this error reaches a client.
    http_status: int = 500
    #: Exit status of the ``agentgym`` command this error ends: 1, a runtime failure (see the module doc).
    exit_status: int = 1


class ConfigError(AgentGymError):
    """A configuration or argument value is invalid. The message names the field to fix."""

    http_status = 422
    exit_status = USAGE_EXIT_STATUS


class RegistryError(AgentGymError):
    """Looking up or registering a named thing failed: an env id, or a plug-in of an
    ``agentgym.plugins.PluginRegistry`` (algorithm, policy loss, loss term, hook option, backend,
    decoding constraint). An unknown name suggests the nearest; a duplicate says to pass ``override=True``."""

    http_status = 404
    exit_status = USAGE_EXIT_STATUS


class UnknownEnv(RegistryError):
    """No env is registered under the id."""


class DuplicateEnv(RegistryError):
    """The id is already registered; pass ``override=True`` to replace it."""

    http_status = 409


class VersionNotFound(RegistryError):
    """The env name is registered, but not in the requested version."""


class UnknownPlugin(RegistryError, ConfigError):
    """A setting (``model.backend``, a decoding constraint) names no registered plug-in.

    It is a ``ConfigError`` too, because the name comes from a config or a request: code that reports
    bad settings in one line (the config check, the policy server's 400 answers) catches it as such.
    """


class EnvContractError(AgentGymError):
    """An env (or a caller) broke the text-env contract."""

    http_status = 409


class ResetNeeded(EnvContractError):
    """``step`` or ``fork`` was called before ``reset``."""


class EpisodeFinished(EnvContractError):
    """``step`` was called after the episode terminated or was truncated; call ``reset``."""


class CheckFailed(EnvContractError):
    """``check_env`` found the env breaking a rule of the contract.

    Attributes:
        rule: the name of the ``agentgym.checker`` function that found it, e.g. ``"check_state_key"``.
    """

    def __init__(self, message: str, rule: str = "") -> None:
        super().__init__(message)
        self.rule = rule


class EnvCrashed(AgentGymError):
    """Env code raised an exception inside ``reset`` or ``step``.

    The episode cannot continue; ``reset`` starts a new one. Over HTTP this is a 500 that fails
    only the session whose env crashed. A session whose step outlived the service's step timeout
    is *poisoned* instead: its env may still be running, so every request answers ``EnvCrashed``
    until the session is deleted and a new one created.
    """

    http_status = 500


class SessionError(AgentGymError):
    """A session of the HTTP service could not be used."""

    http_status = 404


class UnknownSession(SessionError):
    """No live session has that id: it was never created, was deleted, or was reaped when idle."""


class SessionLost(SessionError):
    """The session's env is gone with the env-worker process that held it (``agentgym serve
    --workers N``: that process died and was replaced). The episode cannot continue; create a new
    session (``agentgym.http.fleet.EnvFleet`` replays the episode on a new one by itself)."""

    http_status = 410


class SessionCapacityError(SessionError):
    """The service already holds ``max_sessions`` sessions; retry after some are closed."""

    http_status = 503


class SandboxBusy(SessionCapacityError):
    """The sandbox service already runs ``max_concurrency`` programs; retry shortly (HTTP 503).

    The service turns a run away before starting it, so sending the same run again is safe.
    """


class RemoteEnvError(AgentGymError):
    """Talking to a service failed: the transport, or an answer that is not a service's error body."""

    http_status = 502


class RemoteTimeout(RemoteEnvError):
    """A request, or an env step on the service, ran past its deadline (client-side, or HTTP 504 / 408)."""

    http_status = 504


class RequestRejected(RemoteEnvError):
    """The service rejected the request as malformed (422) or too large (413)."""

    http_status = 422


class AuthenticationError(RemoteEnvError):
    """The service wants a bearer token and got none or a wrong one."""

    http_status = 401


class JudgeError(AgentGymError):
    """The judge gave no usable score: its endpoint failed or timed out after the retries, refused the
    request, or never answered with a score line. The message is one line naming the fix.

    Attributes:
        raw: the judge's last answer, when one came (an answer without a valid score line).
    """

    http_status = 502

    def __init__(self, message: str, raw: str | None = None) -> None:
        super().__init__(message)
        self.raw = raw


def exit_status(exc: BaseException) -> int:
    """The ``agentgym`` command's exit status when ``exc`` ends it: the one rule every command follows.

    Example:
        >>> exit_status(ConfigError("--port must be in [1, 65535], got 0"))
        2
        >>> exit_status(RemoteTimeout("the env service did not answer in 60 s"))
        1
        >>> exit_status(KeyboardInterrupt())
        130
    """
    if isinstance(exc, KeyboardInterrupt):
        return INTERRUPTED_EXIT_STATUS
    if isinstance(exc, AgentGymError):
        return exc.exit_status
    return 1


#: Every public exception class by name, so the HTTP client can map ``error.type`` back.
ERRORS_BY_NAME: dict[str, type[AgentGymError]] = {
    cls.__name__: cls
    for cls in (
        AgentGymError,
        RegistryError,
        UnknownEnv,
        DuplicateEnv,
        VersionNotFound,
        UnknownPlugin,
        EnvContractError,
        ResetNeeded,
        EpisodeFinished,
        CheckFailed,
        EnvCrashed,
        SessionError,
        UnknownSession,
        SessionLost,
        SessionCapacityError,
        SandboxBusy,
        RemoteEnvError,
        RemoteTimeout,
        RequestRejected,
        AuthenticationError,
        JudgeError,
        ConfigError,
    )
}
