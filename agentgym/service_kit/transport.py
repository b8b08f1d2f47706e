"""``LeanAsyncTransport``: plain HTTP/1.1 keep-alive over asyncio streams, as an ``httpx`` transport.

``httpx``'s default async transport (``httpcore`` on ``anyio``) spends about a millisecond of CPU
per request; an env service answers a step in a tenth of that, so a client stepping sessions one
request at a time was the bottleneck, not the service. This transport does only what an agentgym
service needs (``http://``, ``Content-Length`` or chunked answers, persistent connections) in a
few dozen microseconds, and keeps everything else ``httpx``'s: the client API, the
``httpx.Request``/``httpx.Response`` types, and the exception classes the retry policy reads.

Which failure raises which ``httpx`` error (what ``agentgym.service_kit.base.RetryPolicy`` needs to know):

- ``ConnectError`` / ``ConnectTimeout``: no connection was made; the request never left.
- ``PoolTimeout``: every connection stayed busy past the pool deadline; the request never left.
- ``WriteTimeout`` / ``ReadTimeout``: the request may have reached the service.
- ``RemoteProtocolError``: the service closed the connection or sent something that is not
  HTTP/1.1; the request may have reached it.

``https://`` URLs are not handled here: ``AsyncServiceClient`` keeps ``httpx``'s own transport for them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any

import httpx

#: Longest status line + headers accepted (the service's are a few hundred bytes).
_MAX_HEAD_BYTES = 64 * 1024


class _Connection:
    """One keep-alive connection: its streams and whether it can carry another request."""

    __slots__ = ("loop", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.loop = asyncio.get_running_loop()

    def usable(self) -> bool:
        """False once the peer closed it (an idle keep-alive connection the service timed out), or
        when it belongs to another event loop (a client used again under a new ``asyncio.run``)."""
        return (self.loop is asyncio.get_running_loop() and not self.loop.is_closed()
                and not (self.reader.at_eof() or self.writer.is_closing()))

    def close(self) -> None:
        if self.loop.is_closed():  # its transport went with its loop
            return
        with contextlib.suppress(Exception):
            self.writer.close()


class LeanAsyncTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 keep-alive connections to ``http://`` services, at most ``max_connections`` at once.

    Args:
        max_connections: connections open at once, over every host (``httpx.Limits.max_connections``).
        max_keepalive_connections: idle connections kept for reuse per host.

    Timeouts are the request's (``httpx``'s ``timeout`` extension: connect, write, read, pool).

    Example:
        >>> client = httpx.AsyncClient(transport=LeanAsyncTransport())
    """

    def __init__(self, *, max_connections: int | None = 256,
                 max_keepalive_connections: int | None = 64) -> None:
        self._max_connections = max_connections
        self._slots: asyncio.Semaphore | None = None
        self._slots_loop: asyncio.AbstractEventLoop | None = None
        self._keep = max_keepalive_connections if max_keepalive_connections is not None else 1 << 30
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._closed = False

    @classmethod
    def from_limits(cls, limits: httpx.Limits) -> LeanAsyncTransport:
        return cls(max_connections=limits.max_connections,
                   max_keepalive_connections=limits.max_keepalive_connections)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme != "http":
            raise httpx.UnsupportedProtocol("LeanAsyncTransport speaks plain http only, "
                                            f"not {request.url.scheme!r}", request=request)
        if self._closed:
            raise httpx.ConnectError("the transport is closed", request=request)
        timeouts = request.extensions.get("timeout", {})
        key = (request.url.host, request.url.port or 80)
        body = request.content if isinstance(request.stream, httpx.ByteStream) else await request.aread()
        head = _request_head(request, key, len(body))
        await self._acquire(request, timeouts.get("pool"))
        try:
            connection = await self._connect(request, key, timeouts.get("connect"))
            try:
                response, reusable = await self._exchange(connection, request, head + body, timeouts)
            except BaseException:
                connection.close()
                raise
            if reusable and not self._closed and len(self._idle.setdefault(key, [])) < self._keep:
                self._idle[key].append(connection)
            else:
                connection.close()
            return response
        finally:
            if self._slots is not None:
                self._slots.release()

    async def aclose(self) -> None:
        self._closed = True
        for connections in self._idle.values():
            for connection in connections:
                connection.close()
        self._idle.clear()

    # --- internals ------------------------------------------------------------------------------

    async def _acquire(self, request: httpx.Request, timeout: float | None) -> None:
        if not self._max_connections:
            return
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots_loop is not loop:  # a semaphore serves one event loop
            self._slots, self._slots_loop = asyncio.Semaphore(self._max_connections), loop
        if not self._slots.locked():  # a free slot: no deadline to arm
            await self._slots.acquire()
            return
        try:
            async with asyncio.timeout(timeout):
                await self._slots.acquire()
        except TimeoutError:
            raise httpx.PoolTimeout(f"no free connection within {timeout} s (max_connections reached)",
                                    request=request) from None

    async def _connect(self, request: httpx.Request, key: tuple[str, int],
                       timeout: float | None) -> _Connection:
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop()
            if connection.usable():
                return connection
            connection.close()
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(*key, limit=_MAX_HEAD_BYTES)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {key[0]}:{key[1]} took over {timeout} s",
                                       request=request) from None
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {key[0]}:{key[1]}: {exc}", request=request) from exc
        return _Connection(reader, writer)

    async def _exchange(self, connection: _Connection, request: httpx.Request, payload: bytes,
                        timeouts: dict[str, Any]) -> tuple[httpx.Response, bool]:
        connection.writer.write(payload)
        try:
            if connection.writer.transport.get_write_buffer_size():  # else the socket took it all
                async with asyncio.timeout(timeouts.get("write")):
                    await connection.writer.drain()
        except TimeoutError:
            raise httpx.WriteTimeout(f"sending the request took over {timeouts.get('write')} s",
                                     request=request) from None
        except OSError as exc:
            raise httpx.RemoteProtocolError(f"the connection broke while sending: {exc}",
                                            request=request) from exc
        try:
            async with asyncio.timeout(timeouts.get("read")):
                return await _read_response(connection.reader, request)
        except TimeoutError:
            raise httpx.ReadTimeout(f"no answer within {timeouts.get('read')} s", request=request) from None
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError, ValueError) as exc:
            raise httpx.RemoteProtocolError(f"the service closed the connection or answered malformed HTTP: "
                                            f"{type(exc).__name__}: {exc}", request=request) from exc


def _request_head(request: httpx.Request, key: tuple[str, int], length: int) -> bytes:
    target = request.url.raw_path.decode("ascii")
    lines = [f"{request.method} {target} HTTP/1.1", f"Host: {key[0]}:{key[1]}"]
    # No accept-encoding: the answers come back uncompressed (nothing to decode on either side).
    skip = {b"host", b"content-length", b"transfer-encoding", b"connection", b"accept-encoding"}
    lines += [f"{name.decode('latin-1')}: {value.decode('latin-1')}"
              for name, value in request.headers.raw if name.lower() not in skip]
    if length or request.method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _read_response(reader: asyncio.StreamReader, request: httpx.Request) -> tuple[httpx.Response, bool]:
    """One response off ``reader``; whether the connection can carry another request."""
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *header_lines = head[:-4].decode("latin-1").split("\r\n")
    version, status, *_ = status_line.split(" ", 2)
    if not version.startswith("HTTP/1."):
        raise ValueError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
    headers = [_header(line) for line in header_lines]
    fields = {name.lower(): value.strip() for name, value in headers}
    if request.method == "HEAD" or status.startswith("1") or status in ("204", "304"):
        content = b""  # no body, whatever the headers announce (RFC 9112, section 6.3)
    elif "chunked" in fields.get("transfer-encoding", "").lower():
        content = await _read_chunked(reader)
    elif "content-length" in fields:
        content = await reader.readexactly(int(fields["content-length"]))
    else:  # no length: the body runs to the end of the connection
        content = await reader.read()
        return _response(int(status), headers, content, request), False
    reusable = fields.get("connection", "").lower() != "close" and version != "HTTP/1.0"
    return _response(int(status), headers, content, request), reusable


def _header(line: str) -> tuple[str, str]:
    name, sep, value = line.partition(":")
    if not sep:
        raise ValueError(f"malformed header line {line[:80]!r}")
    return name, value.strip()


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers, then the blank line
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


def _response(status: int, headers: Iterable[tuple[str, str]], content: bytes, request: httpx.Request
              ) -> httpx.Response:
    # The body is whole and de-chunked: drop the framing header (httpx decodes a content-encoding itself).
    kept = [(n, v) for n, v in headers if n.lower() != "transfer-encoding"]
    return httpx.Response(status, headers=kept, content=content, request=request,
                          extensions={"http_version": b"HTTP/1.1"})
