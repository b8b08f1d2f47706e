"""What every ``serve`` command checks before it serves: flag ranges, exposure without a token, and
the port (bound here, so an occupied one is one line, not a banner followed by uvicorn's error)."""

from __future__ import annotations

import errno
import ipaddress
import math
import socket
from typing import Any

from agentgym.errors import ConfigError

MIN_PORT, MAX_PORT = 1, 65535


def check_range(flag: str, value: float, low: float | None = None, high: float | None = None, *,
                low_open: bool = False) -> None:
    """Raise ``ConfigError`` naming ``flag`` and its valid range when ``value`` is outside it.

    Example:
        >>> check_range("--port", 70000, 1, 65535)
        Traceback (most recent call last):
        ...
        agentgym.errors.ConfigError: --port must be in [1, 65535], got 70000
        >>> check_range("--ttl-s", 0, 0, low_open=True)
        Traceback (most recent call last):
        ...
        agentgym.errors.ConfigError: --ttl-s must be > 0, got 0
    """
    below = low is not None and (value <= low if low_open else value < low)
    above = high is not None and value > high
    if not (below or above or math.isnan(value)):
        return
    if low is not None and high is not None:
        bounds = f"in ({low:g}, {high:g}]" if low_open else f"in [{low:g}, {high:g}]"
    elif low is not None:
        bounds = f"> {low:g}" if low_open else f">= {low:g}"
    else:
        bounds = f"<= {high:g}"
    raise ConfigError(f"{flag} must be {bounds}, got {value:g}")


def is_loopback(host: str) -> bool:
    """Whether ``host`` reaches only this machine (``127.0.0.0/8``, ``::1``, ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, token: str | None, allow_no_token: bool, what: str, *,
                   variable: str | None = None, has_token: bool = True) -> None:
    """Refuse to serve on a non-loopback address without a token, unless explicitly acknowledged.

    Anyone who can reach such an address could otherwise use the service (``what``); a container
    binds 0.0.0.0, so its image or deploy file must supply the token (or demand it by name).

    Args:
        host: the address to bind.
        token: the bearer token, if any.
        allow_no_token: the user passed ``--allow-no-token`` (or set ``AGENTGYM_ALLOW_NO_TOKEN``).
        what: what anyone on the network could then do, for the message.
        variable: the environment variable ``--token`` reads, named first in the message: where the
            service runs from a deploy file, setting it is the fix.
        has_token: False for a service without a token option (the message then offers none).

    Example:
        >>> check_exposure("0.0.0.0", None, False, "query this index", variable="AGENTGYM_RETRIEVAL_TOKEN")
        Traceback (most recent call last):
        ...
        agentgym.errors.ConfigError: --host 0.0.0.0 without --token would let anyone who can reach this \
port query this index; set AGENTGYM_RETRIEVAL_TOKEN to the bearer token clients must send (or pass --token), \
bind 127.0.0.1, or pass --allow-no-token (AGENTGYM_ALLOW_NO_TOKEN=1) to accept that
    """
    if token or allow_no_token or is_loopback(host):
        return
    accept = "pass --allow-no-token (AGENTGYM_ALLOW_NO_TOKEN=1) to accept that"
    if not has_token:
        raise ConfigError(f"--host {host} has no token to ask for, so anyone who can reach this port could "
                          f"{what}; bind 127.0.0.1, or {accept}")
    set_token = (f"set {variable} to the bearer token clients must send (or pass --token)" if variable
                 else "pass --token")
    raise ConfigError(f"--host {host} without --token would let anyone who can reach this port {what}; "
                      f"{set_token}, bind 127.0.0.1, or {accept}")


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``; an occupied or unusable address is a one-line ``ConfigError``."""
    check_range("--port", port, MIN_PORT, MAX_PORT)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"--host {host}: not an address of this machine ({exc.strerror})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(f"--port {port}: the port is already in use on {host}; stop what holds it or "
                              "choose another port") from None
        raise ConfigError(f"--host {host} --port {port}: cannot listen there ({exc.strerror})") from None
    sock.set_inheritable(True)
    return sock


def run_uvicorn(app: Any, sock: socket.socket, *, log_level: str = "warning",
                access_log: bool = False) -> None:
    """Serve ``app`` with uvicorn on the socket ``bind`` made, until interrupted."""
    import uvicorn

    config = uvicorn.Config(app, log_level=log_level, access_log=access_log)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()


__all__ = ["bind", "check_exposure", "check_range", "is_loopback", "run_uvicorn"]
