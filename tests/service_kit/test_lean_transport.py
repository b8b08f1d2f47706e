"""``LeanAsyncTransport``, the async clients' transport to plain-http services, over real sockets.

Against the real env service (uvicorn on 127.0.0.1) for what users do, and against a small asyncio
server that answers exactly the bytes a test wants, for the HTTP/1.1 cases a well-behaved service
never produces on demand: chunked bodies, bodies that run to the close, ``Connection: close``, an idle
connection the server dropped, a hang, garbage.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from agentgym.errors import RemoteEnvError, RemoteTimeout, ResetNeeded, UnknownSession
from agentgym.http.client import AsyncEnvClient, AsyncRemoteEnv, EnvClient, RemoteEnv
from agentgym.service_kit.base import RetryPolicy
from agentgym.service_kit.launcher import free_port
from agentgym.service_kit.transport import LeanAsyncTransport

pytestmark = pytest.mark.timeout(60)


# --- the real env service --------------------------------------------------------------------------


def test_async_clients_to_http_services_use_the_lean_transport_and_https_ones_httpx() -> None:
    assert isinstance(AsyncEnvClient("http://127.0.0.1:1")._http._transport, LeanAsyncTransport)
    assert not isinstance(AsyncEnvClient("https://example.org")._http._transport, LeanAsyncTransport)
    assert not isinstance(EnvClient("http://127.0.0.1:1")._http._transport, LeanAsyncTransport)


def test_async_remote_env_over_the_lean_transport_plays_like_the_sync_client(live_server) -> None:
    server = live_server(["maze-v0"])

    async def play() -> tuple[list, list[str]]:
        async with AsyncEnvClient(server.url) as client:
            envs = [await AsyncRemoteEnv.create(client, "maze-v0") for _ in range(16)]
            results = []
            for i, env in enumerate(envs):
                results.append(await env.reset(seed=i))
            for turn in range(6):  # 16 sessions stepped concurrently: connections are shared and reused
                results += await asyncio.gather(*(env.step(("up", "down", "left", "right")[(i + turn) % 4])
                                                  for i, env in enumerate(envs)))
            errors = []
            with pytest.raises(UnknownSession) as unknown:
                await client.request("POST", "/sessions/nope/step", {"action": "up"})
            errors.append(str(unknown.value))
            fresh = await AsyncRemoteEnv.create(client, "maze-v0")
            with pytest.raises(ResetNeeded) as reset:
                await fresh.step("up")
            errors.append(str(reset.value))
            for env in [*envs, fresh]:
                await env.close()
            assert (await client.health())["active_sessions"] == 0
            return results, errors

    got, errors = asyncio.run(play())
    with EnvClient(server.url) as client:  # the same calls, sync client over httpx's own transport
        envs = [RemoteEnv("maze-v0", client=client) for _ in range(16)]
        expected = [env.reset(seed=i) for i, env in enumerate(envs)]
        for turn in range(6):
            expected += [env.step(("up", "down", "left", "right")[(i + turn) % 4])
                         for i, env in enumerate(envs)]
        for env in envs:
            env.close()
    assert got == expected
    assert "nope" in errors[0] and "reset" in errors[1].lower()


# --- a server that answers whatever a test wants ---------------------------------------------------


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], "asyncio.Future | object"]


@contextlib.asynccontextmanager
async def raw_server(handler: Callable) -> AsyncIterator[tuple[str, dict[str, int]]]:
    """``handler(reader, writer, connection_number)`` serves each connection; yields the URL and counts."""
    counts = {"connections": 0, "requests": 0}

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        counts["connections"] += 1
        try:
            await handler(reader, writer, counts)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", counts
    finally:
        server.close()
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader, counts: dict[str, int]) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    body = await reader.readexactly(length)
    counts["requests"] += 1
    return body


def answer(body: bytes, *extra: str) -> bytes:
    head = ["HTTP/1.1 200 OK", "Content-Type: application/json", *extra]
    if not any(h.lower().startswith(("transfer-encoding", "connection: close")) for h in extra):
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def test_keep_alive_chunked_and_read_to_close_bodies() -> None:
    async def handler(reader, writer, counts):
        while True:
            body = await read_request(reader, counts)
            if body == b'{"kind":"chunked"}':
                writer.write(answer(b"", "Transfer-Encoding: chunked")
                             + b"6\r\n{\"a\": \r\n2;x=1\r\n1}\r\n0\r\n\r\n")
            elif body == b'{"kind":"to-close"}':
                writer.write(answer(b'{"closed": true}', "Connection: close"))
                await writer.drain()
                return
            else:
                writer.write(answer(body))
            await writer.drain()

    async def scenario() -> None:
        async with raw_server(handler) as (url, counts), AsyncEnvClient(url, retries=0) as client:
            for i in range(5):
                assert await client.request("POST", "/echo", {"n": i}) == {"n": i}
            assert counts["connections"] == 1  # one keep-alive connection carried all five
            assert await client.request("POST", "/x", {"kind": "chunked"}) == {"a": 1}
            assert await client.request("POST", "/x", {"kind": "to-close"}) == {"closed": True}
            assert await client.request("POST", "/echo", {"after": 1}) == {"after": 1}
            assert counts["connections"] == 2  # the closed one was not reused

    asyncio.run(scenario())


def test_head_and_204_answers_have_no_body_whatever_their_headers_say() -> None:
    async def handler(reader, writer, counts):
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            counts["requests"] += 1
            if head.startswith(b"HEAD"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 999\r\n\r\n")
            elif b"/empty" in head:
                writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
            else:
                writer.write(answer(b'{"ok": true}'))
            await writer.drain()

    async def scenario() -> None:
        async with raw_server(handler) as (url, counts):
            async with httpx.AsyncClient(transport=LeanAsyncTransport(), timeout=2) as client:
                head = await client.head(f"{url}/x")
                assert head.status_code == 200 and head.content == b""
                assert (await client.delete(f"{url}/empty")).status_code == 204
                # The connection is still in step.
                assert (await client.get(f"{url}/x")).json() == {"ok": True}
            assert counts == {"connections": 1, "requests": 3}

    asyncio.run(scenario())


def test_an_idle_connection_the_server_dropped_is_not_reused() -> None:
    async def handler(reader, writer, counts):
        writer.write(answer(await read_request(reader, counts)))  # one answer, then the server drops it
        await writer.drain()

    async def scenario() -> None:
        async with raw_server(handler) as (url, counts), AsyncEnvClient(url, retries=0) as client:
            for i in range(3):
                assert await client.request("POST", "/step", {"i": i}) == {"i": i}
                await asyncio.sleep(0.05)  # the close reaches the client while the connection is idle
            assert counts == {"connections": 3, "requests": 3}

    asyncio.run(scenario())


def test_one_client_serves_several_event_loops(live_server) -> None:
    server = live_server(["maze-v0"])
    client = AsyncEnvClient(server.url)

    async def one_episode(seed: int) -> str:
        env = await AsyncRemoteEnv.create(client, "maze-v0")
        observation, _ = await env.reset(seed=seed)
        await env.step("up")
        await env.close()
        return observation

    first = asyncio.run(one_episode(3))  # its connections stay behind, bound to a closed loop
    assert asyncio.run(one_episode(3)) == first
    asyncio.run(client.aclose())


def test_a_hung_server_times_out_and_a_sent_step_is_not_repeated() -> None:
    async def handler(reader, writer, counts):
        await read_request(reader, counts)
        await asyncio.sleep(30)

    async def scenario() -> None:
        async with raw_server(handler) as (url, counts):
            async with AsyncEnvClient(url, timeout_s=0.3, retries=2) as client:
                with pytest.raises(RemoteTimeout, match=r"POST http://127\.0\.0\.1:\d+/sessions/s/step"):
                    await client.request("POST", "/sessions/s/step", {"action": "up"})
            assert counts["requests"] == 1

    asyncio.run(scenario())


@pytest.mark.parametrize("reply", [b"garbage\r\n\r\n",
                                   b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{\"short\"",
                                   b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", b""])
def test_malformed_answers_and_closed_connections_are_remote_errors(reply: bytes) -> None:
    async def handler(reader, writer, counts):
        await read_request(reader, counts)
        writer.write(reply)
        await writer.drain()

    async def scenario() -> None:
        async with raw_server(handler) as (url, counts), AsyncEnvClient(url, retries=2) as client:
            with pytest.raises(RemoteEnvError, match=r"POST http://127\.0\.0\.1:\d+/sessions/s/step failed"):
                await client.request("POST", "/sessions/s/step", {"action": "up"})
            assert counts["requests"] == 1  # it may have acted: never sent twice

    asyncio.run(scenario())


def test_a_refused_connection_is_retried_then_named() -> None:
    url = f"http://127.0.0.1:{free_port()}"

    async def scenario() -> None:
        async with AsyncEnvClient(url, retries=2) as client:
            client.retry = RetryPolicy(retries=2, backoff_s=0.01)
            with pytest.raises(RemoteEnvError,
                               match=r"POST .*/sessions failed: ConnectError.*after 3 attempts"):
                await client.request("POST", "/sessions", {"env_id": "maze-v0"})

    asyncio.run(scenario())


def test_the_pool_limit_holds_and_a_full_pool_times_out() -> None:
    async def handler(reader, writer, counts):
        while True:
            body = await read_request(reader, counts)
            await asyncio.sleep(0.2)
            writer.write(answer(body))
            await writer.drain()

    async def scenario() -> None:
        async with raw_server(handler) as (url, counts):
            transport = LeanAsyncTransport(max_connections=2)
            async with httpx.AsyncClient(transport=transport, timeout=5) as client:
                replies = await asyncio.gather(*(client.post(f"{url}/x", json={"i": i}) for i in range(6)))
                assert [r.json() for r in replies] == [{"i": i} for i in range(6)]
                assert counts["connections"] == 2
            transport = LeanAsyncTransport(max_connections=1)
            async with httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(5, pool=0.05)) as client:
                first = asyncio.ensure_future(client.post(f"{url}/x", json={}))
                await asyncio.sleep(0.02)
                with pytest.raises(httpx.PoolTimeout):
                    await client.post(f"{url}/x", json={})
                assert (await first).json() == {}

    asyncio.run(scenario())


def test_https_is_refused_with_a_clear_error() -> None:
    async def scenario() -> None:
        async with httpx.AsyncClient(transport=LeanAsyncTransport()) as client:
            with pytest.raises(httpx.UnsupportedProtocol, match="plain http only"):
                await client.get("https://127.0.0.1:1/")

    asyncio.run(scenario())
