"""The code sandbox: runs, limits, scratch dir, warm pool, and the HTTP service (in-process and on a
socket)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from conftest import LiveServer

from agentgym.errors import AuthenticationError, ConfigError, RequestRejected, SandboxBusy
from agentgym.sandbox import (
    BwrapBackend,
    DockerBackend,
    Limits,
    Result,
    SubprocessBackend,
    WarmPool,
    run_code,
)
from agentgym.sandbox.client import SandboxClient
from agentgym.sandbox.service import create_sandbox_app

pytestmark = pytest.mark.timeout(120)

BWRAP = BwrapBackend.available()
# bubblewrap is part of the test set-up (`make test` installs it): without it these tests fail
# with the probe's reason instead of being skipped.
needs_bwrap = pytest.mark.usefixtures("require_bwrap")


def _require_bwrap() -> None:
    if not BWRAP:
        pytest.fail(f"bwrap cannot run here: {BwrapBackend.unavailable_reason()}; install bubblewrap "
                    "(apt-get install bubblewrap) — `make test` does it")


@pytest.fixture()
def require_bwrap() -> None:
    _require_bwrap()


def backends() -> list[object]:
    return ["bwrap", "subprocess"]


def make(name: str, **kwargs: object):
    if name == "bwrap":
        _require_bwrap()
        return BwrapBackend(**kwargs)  # type: ignore[arg-type]
    return SubprocessBackend(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", backends())
def test_stdout_stderr_exit_code_and_stdin(name: str) -> None:
    code = "import sys\nprint(sys.stdin.read().upper())\nprint('warn', file=sys.stderr)\nsys.exit(3)\n"
    result = make(name).run(code, "hello")
    assert (result.stdout, result.stderr, result.exit_code) == ("HELLO\n", "warn\n", 3)
    assert not result.timed_out and result.killed_reason is None and not result.truncated
    assert result.backend == name


@pytest.mark.parametrize("name", backends())
def test_exception_gives_exit_1_and_a_clean_traceback(name: str) -> None:
    result = make(name).run("def f():\n    1 / 0\nf()\n")
    assert result.exit_code == 1
    assert "ZeroDivisionError" in result.stderr and "main.py" in result.stderr
    assert "bootstrap" not in result.stderr and "<string>" not in result.stderr


@pytest.mark.parametrize("name", backends())
def test_a_shadowing_working_directory_changes_nothing_inside(name: str, tmp_path, monkeypatch) -> None:
    # The host's working directory holds modules named like the framework and the standard library.
    (tmp_path / "agentgym").mkdir()
    (tmp_path / "agentgym" / "__init__.py").write_text("raise SystemExit('shadow agentgym imported')\n")
    for module in ("json", "resource", "types"):
        (tmp_path / f"{module}.py").write_text(f"raise SystemExit('shadow {module} imported')\n")
    monkeypatch.chdir(tmp_path)
    result = make(name).run("import json, types\nprint(json.dumps([1]), types.__name__)\n")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "[1] types\n", "")


@pytest.mark.parametrize("name", backends())
def test_the_worker_command_line_shows_no_framework_source(name: str) -> None:
    result = make(name).run("print(repr(open('/proc/self/cmdline', 'rb').read().decode()))\n")
    assert result.exit_code == 0, result.stderr
    assert "setrlimit" not in result.stdout and "def main" not in result.stdout and len(result.stdout) < 1024


@pytest.mark.parametrize("name", backends())
def test_output_cap_truncates_and_flags(name: str) -> None:
    result = make(name).run("while True:\n    print('y' * 1000)\n", limits=Limits(output_bytes=5000))
    assert result.truncated and result.killed_reason == "output_limit"
    assert len(result.stdout.encode()) + len(result.stderr.encode()) == 5000


@pytest.mark.parametrize("name", backends())
def test_timeout_kills_and_flags(name: str) -> None:
    started = time.monotonic()
    result = make(name).run("import time\nprint('start', flush=True)\ntime.sleep(30)\n",
                            limits=Limits(wall_clock_s=1))
    assert result.timed_out and result.killed_reason == "wall_clock" and result.exit_code is None
    assert result.stdout == "start\n"  # output before the kill is kept
    # Killed at ~1 s, long before the 30 s sleep ends (loose: busy CI cores).
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("name", backends())
def test_cpu_limit_kills_busy_loop(name: str) -> None:
    result = make(name).run("while True:\n    pass\n", limits=Limits(wall_clock_s=8, cpu_s=1))
    assert result.killed_reason == "cpu" and not result.timed_out


@pytest.mark.parametrize("name", backends())
def test_memory_limit_makes_a_big_allocation_fail(name: str) -> None:
    code = ("try:\n    b = bytearray(400 * 2**20)\n    print('allocated')\n"
            "except MemoryError:\n    print('refused')\n")
    assert make(name).run(code, limits=Limits(memory_mb=200)).stdout == "refused\n"
    small = make(name).run("b = bytearray(50 * 2**20)\nprint('ok')", limits=Limits(memory_mb=200))
    assert small.stdout == "ok\n"


@pytest.mark.parametrize("name", backends())
def test_scratch_dir_is_writable_and_removed_afterwards(name: str, tmp_path) -> None:
    code = ("import os\nopen('out.txt', 'w').write('data')\nos.mkdir('sub')\n"
            "open(os.path.join(os.environ['HOME'], 'h.txt'), 'w').write('x')\n"
            "import tempfile\nopen(os.path.join(tempfile.gettempdir(), 't.txt'), 'w').write('x')\n"
            "print(sorted(os.listdir('.')))\n")
    result = make(name, scratch_root=tmp_path).run(code)
    assert result.exit_code == 0, result.stderr
    assert "out.txt" in result.stdout and "sub" in result.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", backends())
def test_environment_is_scrubbed(name: str, monkeypatch) -> None:
    monkeypatch.setenv("AGENTGYM_TEST_SECRET", "s3cret")
    result = make(name).run("import os\nprint(sorted(os.environ))")
    assert "AGENTGYM_TEST_SECRET" not in result.stdout
    assert "'HOME'" in result.stdout and "'PATH'" in result.stdout


def test_limits_validate_fields() -> None:
    with pytest.raises(ConfigError, match="wall_clock_s"):
        Limits(wall_clock_s=-1)
    assert Limits(wall_clock_s=2.5).cpu_limit_s == 4


def test_subprocess_backend_says_it_is_not_secure_and_docker_is_absent_here() -> None:
    assert SubprocessBackend.secure is False and BwrapBackend.secure is True
    assert "NOT a security boundary" in (SubprocessBackend.__doc__ or "")
    assert DockerBackend.available() in (True, False)  # never raises; False without an engine
    with pytest.raises(ConfigError, match="unknown sandbox backend"):
        run_code("print(1)", backend="nope")  # type: ignore[arg-type]


@needs_bwrap
def test_run_code_defaults_to_bwrap() -> None:
    assert run_code("print(2 + 2)").stdout == "4\n"
    assert run_code("print(2 + 2)").backend == "bwrap"


@pytest.mark.parametrize("name", backends())
def test_warm_pool_serves_runs_from_workers_spawned_ahead_and_uses_each_once(name: str) -> None:
    # Latency is measured by benchmarks/tools.py; here: runs take a worker spawned before the request.
    backend = make(name)
    spawned: list[tuple[float, object]] = []
    spawn = backend.spawn

    def recording_spawn(*args):
        worker = spawn(*args)
        spawned.append((time.monotonic(), worker))
        return worker

    backend.spawn = recording_spawn  # type: ignore[method-assign]
    used = []
    with WarmPool(backend, size=2) as pool:
        deadline = time.monotonic() + 30
        for i in range(5):
            while pool.idle < 1 and time.monotonic() < deadline:  # a ready worker, not the refill
                time.sleep(0.01)
            requested = time.monotonic()
            worker = pool.acquire()
            assert any(w is worker and at < requested for at, w in spawned), "the run waited for a spawn"
            # no state leaks between runs: each run sees a fresh interpreter
            result = worker.execute("import sys\nprint(sys.stdin.read(), 'leak' in globals())\nleak = 1",
                                    str(i), Limits())
            assert result.stdout == f"{i} False\n"
            used.append(worker)
    assert len({id(w) for w in used}) == 5  # each worker serves one run
    assert not any(w.alive() for w in used)


# --- the service, in-process ------------------------------------------------------------------


class _SyncASGI(httpx.BaseTransport):
    """Sync transport over an ASGI app (httpx's ASGITransport is async only)."""

    def __init__(self, app) -> None:
        self.transport = httpx.ASGITransport(app=app)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        async def go() -> httpx.Response:
            response = await self.transport.handle_async_request(request)
            body = b"".join([chunk async for chunk in response.stream])
            return httpx.Response(response.status_code, headers=response.headers, content=body)

        return asyncio.run(go())


def sync_client(app, token: str | None = None) -> SandboxClient:
    return SandboxClient("http://sandbox", token=token, transport=_SyncASGI(app))


def test_service_runs_code_and_reports_health_and_metrics() -> None:
    app = create_sandbox_app(SubprocessBackend(), max_limits=Limits(wall_clock_s=5))
    client = sync_client(app)
    health = client.health()
    assert health["backend"] == "subprocess" and health["secure"] is False and health["pool_size"] == 0
    result = client.run("import sys\nprint(sys.stdin.read()[::-1])", stdin="abc")
    assert result.stdout == "cba\n" and result.exit_code == 0
    assert client.run("import time\ntime.sleep(5)", limits={"wall_clock_s": 0.5}).timed_out
    metrics = client.metrics()
    assert "agentgym_sandbox_runs_total 2.0" in metrics
    assert "agentgym_sandbox_timeouts_total 1.0" in metrics
    assert 'agentgym_sandbox_kills_total{reason="wall_clock"} 1.0' in metrics
    assert "agentgym_sandbox_run_seconds_bucket" in metrics


def test_service_rejects_bad_input_with_422() -> None:
    app = create_sandbox_app(SubprocessBackend(), max_limits=Limits(wall_clock_s=5))
    client = sync_client(app)
    with pytest.raises(RequestRejected, match="limits.wall_clock_s: Input should be less than or equal to 5"):
        client.run("print(1)", limits={"wall_clock_s": 60})
    with pytest.raises(RequestRejected, match="limits.cpu_s: Input should be less than or equal to 6"):
        client.run("print(1)", limits={"cpu_s": 7})  # the maximum's CPU rule: ceil(5 s) + 1
    with pytest.raises(RequestRejected, match="greater than 0"):
        client.run("print(1)", limits={"memory_mb": -5})
    transport = _SyncASGI(app)
    with httpx.Client(transport=transport, base_url="http://sandbox") as raw:
        for body in ({"cod": "x"}, {"code": 5}, {"code": "x", "limits": {"bogus": 1}},
                     {"code": "x", "limits": {"wall_clock_s": True}},
                     {"code": "x", "limits": {"memory_mb": "64"}},
                     {"code": "x", "limits": {"memory_mb": 64.5}}):
            response = raw.post("/run", json=body)
            assert response.status_code == 422
            assert response.json()["error"]["type"] == "RequestRejected"
        response = raw.post("/run", content=b"{not json", headers={"content-type": "application/json"})
        assert response.status_code == 422


def test_service_request_size_limit_gives_413() -> None:
    app = create_sandbox_app(SubprocessBackend(), max_body_bytes=1000)
    with pytest.raises(RequestRejected, match="exceeds the limit"):
        sync_client(app).run("x = '" + "a" * 5000 + "'")


def test_service_token_gives_401() -> None:
    app = create_sandbox_app(SubprocessBackend(), token="tok")
    assert sync_client(app).health()["status"] == "ok"  # /health stays open
    with pytest.raises(AuthenticationError):
        sync_client(app).run("print(1)")
    with pytest.raises(AuthenticationError):
        sync_client(app, token="wrong").run("print(1)")
    assert sync_client(app, token="tok").run("print(1)").stdout == "1\n"


def test_service_capacity_gives_503() -> None:
    app = create_sandbox_app(SubprocessBackend(), max_concurrency=1)

    async def scenario() -> list[int]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://sandbox") as http:
            slow = asyncio.create_task(http.post("/run", json={"code": "import time\ntime.sleep(1)"}))
            await asyncio.sleep(0.3)
            busy = await http.post("/run", json={"code": "print(1)"})
            assert busy.headers["retry-after"] == "1"
            assert busy.json()["error"]["type"] == "SandboxBusy"
            return [(await slow).status_code, busy.status_code]

    assert asyncio.run(scenario()) == [200, 503]


def test_client_maps_503_to_sandbox_busy() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"error": {"type": "SandboxBusy", "message": "busy"}})

    with pytest.raises(SandboxBusy):
        SandboxClient("http://sandbox", transport=httpx.MockTransport(handler)).run("print(1)")


def test_client_resends_a_busy_request_after_retry_after() -> None:
    answers = iter([503, 503, 200])
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        status = next(answers)
        if status == 503:
            return httpx.Response(503, headers={"Retry-After": "0"},
                                  json={"error": {"type": "SandboxBusy", "message": "busy"}})
        return httpx.Response(200, json=Result("1\n", "", 0, False, None, 0.01, False).to_dict())

    client = SandboxClient("http://sandbox", transport=httpx.MockTransport(handler), busy_retries=2)
    assert client.run("print(1)").stdout == "1\n" and seen == ["/run"] * 3
    answers = iter([503, 503, 503])
    with pytest.raises(SandboxBusy):  # out of retries: the service's answer stands
        SandboxClient("http://sandbox", transport=httpx.MockTransport(handler),
                      busy_retries=2).run("print(1)")


# --- the service on a real socket ------------------------------------------------------------


def test_service_over_a_real_socket() -> None:
    backend = BwrapBackend() if BWRAP else SubprocessBackend()
    server = LiveServer(create_sandbox_app(backend, pool_size=1, token="tok"))
    try:
        with SandboxClient(server.url, token="tok", timeout_s=20) as client:
            assert client.health()["backend"] == backend.name
            assert client.run("print(sum(range(10)))").stdout == "45\n"
            if backend.secure:  # on the subprocess backend this would kill the test process itself
                # a program that kills everything it can does not hurt the service
                client.run("import os, signal\nfor pid in (os.getppid(), -1):\n    try:\n"
                           "        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass")
            assert client.run("print('still here')").stdout == "still here\n"
    finally:
        server.stop()


# --- the run as a whole -----------------------------------------------------------------------


def test_children_of_a_finished_run_are_killed_on_the_subprocess_backend(tmp_path) -> None:
    # The program exits at once; before, its forked children lived on (the group was killed only
    # while its leader lived) and wrote their file a second later.
    marker = tmp_path / "outlived"
    code = (f"import os, time\nfor _ in range(3):\n    if os.fork() == 0:\n        time.sleep(1)\n"
            f"        open({str(marker)!r}, 'a').write('x')\n        os._exit(0)\nprint('bye')\n")
    result = SubprocessBackend().run(code, limits=Limits(wall_clock_s=5))
    assert result.stdout == "bye\n" and result.exit_code == 0
    time.sleep(1.5)
    assert not marker.exists()


def test_subprocess_run_memory_is_bounded_as_a_whole_by_the_supervisor() -> None:
    backend = SubprocessBackend(memory_guard="supervisor")
    code = ("import os, time\nfor _ in range(3):\n    if os.fork() == 0:\n        b = b'x' * (150 * 2**20)\n"
            "        time.sleep(30)\ntime.sleep(30)\n")
    result = backend.run(code, limits=Limits(wall_clock_s=8, memory_mb=256))
    assert result.killed_reason == "memory" and result.memory_guard == "supervisor"
    assert result.disk_mb is None  # nothing bounds the subprocess backend's disk, and it says so


@pytest.mark.parametrize("name", backends())
def test_result_reports_the_memory_guard_and_the_scratch_size(name: str) -> None:
    from agentgym.sandbox.cgroup import memory_cgroup_parent

    result = make(name).run("print(1)", limits=Limits(disk_mb=8))
    expected = "cgroup" if memory_cgroup_parent()[0] is not None else "supervisor"
    assert result.memory_guard == expected
    assert result.disk_mb == (8 if name == "bwrap" else None)


@needs_bwrap
def test_warm_pool_spawns_a_fresh_worker_for_another_scratch_size() -> None:
    with WarmPool(BwrapBackend(), size=1, limits=Limits(disk_mb=8)) as pool:
        code = "import os\ns = os.statvfs('.')\nprint(s.f_blocks * s.f_frsize // 2**20)"
        assert pool.run(code, limits=Limits(disk_mb=8)).stdout == "8\n"
        assert pool.run(code, limits=Limits(disk_mb=24)).stdout == "24\n"


def test_two_services_in_one_process_keep_their_own_limits_and_counts() -> None:
    """The routes are shared functions: each reaches its own app's service (maxima, schema, metrics)."""
    small = create_sandbox_app(SubprocessBackend(), max_limits=Limits(wall_clock_s=5))
    large = create_sandbox_app(SubprocessBackend(), max_limits=Limits(wall_clock_s=10))
    for app, ceiling in ((small, 5), (large, 10)):
        schema = app.openapi()["components"]["schemas"]["LimitsOverride"]["properties"]["wall_clock_s"]
        assert schema["anyOf"][0]["maximum"] == ceiling
        assert sync_client(app).health()["max_limits"]["wall_clock_s"] == ceiling
    with pytest.raises(RequestRejected, match="less than or equal to 5"):
        sync_client(small).run("print(1)", limits={"wall_clock_s": 8})
    assert sync_client(large).run("print(1)", limits={"wall_clock_s": 8}).stdout == "1\n"
    assert "agentgym_sandbox_runs_total 0.0" in sync_client(small).metrics()
    assert "agentgym_sandbox_runs_total 1.0" in sync_client(large).metrics()
    assert 'agentgym_sandbox_errors_total{type="RequestRejected"} 1.0' in sync_client(small).metrics()
    assert "agentgym_sandbox_errors_total{" not in sync_client(large).metrics()


def test_service_health_says_what_bounds_a_run() -> None:
    from agentgym.sandbox.cgroup import memory_cgroup_parent

    health = sync_client(create_sandbox_app(SubprocessBackend(memory_guard="supervisor"))).health()
    assert health["memory_guard"] == "supervisor" and health["seccomp"] is False
    if BWRAP:
        health = sync_client(create_sandbox_app(BwrapBackend())).health()
        assert health["seccomp"] is True
        assert health["memory_guard"] == ("cgroup" if memory_cgroup_parent()[0] is not None else "supervisor")
        assert health["default_limits"]["disk_mb"] == Limits().disk_mb


def test_a_killed_service_leaves_scratch_dirs_that_the_next_start_removes(tmp_path) -> None:
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from agentgym.service_kit.launcher import free_port, start_service, stop_service

    env = {**os.environ, "TMPDIR": str(tmp_path)}
    agentgym = [str(Path(sys.executable).with_name("agentgym"))]

    def start() -> subprocess.Popen:
        port = free_port()
        return start_service([*agentgym, "sandbox", "serve", "--backend", "subprocess", "--pool-size", "3",
                              "--port", str(port)], f"http://127.0.0.1:{port}", env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    first = start()
    deadline = time.monotonic() + 20
    while len(list(tmp_path.glob("agentgym-sandbox-*"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    left = {path.name for path in tmp_path.glob("agentgym-sandbox-*")}
    assert len(left) >= 3  # kill -9: nothing ran to clean up
    second = start()
    try:
        now = {path.name for path in tmp_path.glob("agentgym-sandbox-*")}
        assert left.isdisjoint(now)  # the dead service's dirs are gone; the new one's own remain
    finally:
        stop_service(second)
