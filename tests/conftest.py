"""Shared fixtures of the HTTP tests: small test envs, in-process services and a real uvicorn server."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

# Generated game files (TextWorld) go to a per-run cache, never the user's ~/.cache, removed at exit.
if "AGENTGYM_CACHE" not in os.environ:
    os.environ["AGENTGYM_CACHE"] = tempfile.mkdtemp(prefix="agentgym-test-cache-")
    atexit.register(shutil.rmtree, os.environ["AGENTGYM_CACHE"], ignore_errors=True)

# One torch thread per test process (and per process a test starts): a seeded learning run's numbers depend
# on the thread count (it changes float summation order), so the regression pins hold on any machine; the
# cores are used by running tests side by side instead (`make test` runs pytest-xdist with WORKERS=2).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# pytest-xdist hands its workers the controller's terminal width as COLUMNS; the CLI's consoles read it when
# imported and would lay tables out 80 wide, where the CLI tests check the layout for a pipe (no COLUMNS).
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)

import contextlib
import pickle
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import agentgym
from agentgym.errors import ConfigError
from agentgym.service_kit.launcher import wait_healthy

RUN_CACHE = os.environ["AGENTGYM_CACHE"]

# --- test envs -------------------------------------------------------------------------------


class CounterEnv(agentgym.Env):
    """A counter that starts at a seeded value; say ``inc`` until it reaches the target.

    Every step draws from ``np_random`` into ``info["noise"]``, so a fork that lost the RNG state
    would show in the infos. Other actions are invalid (reward -0.1).
    """

    supports_snapshot = True
    has_expert = True

    def __init__(self, span: int = 4) -> None:
        if not isinstance(span, int) or span < 1:
            raise ValueError(f"span must be a positive integer, got {span!r}")
        self.span = span
        self.count = 0
        self.target = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.count = int(self.np_random.integers(0, 10))
        self.target = self.count + self.span
        if options and "target" in options:
            self.target = int(options["target"])
        info = self._info(task=True)
        if options and "label" in options:
            info["label"] = options["label"]  # echoed as given (the service must encode whatever comes)
        return self._obs("start"), info

    def step(self, action: str):
        invalid = action not in ("inc", "dec")
        if not invalid:
            self.count += 1 if action == "inc" else -1
        solved = self.count == self.target
        reward = -0.1 if invalid else (1.0 if solved else 0.0)
        info = self._info()
        info.update(invalid_action=invalid, success=solved, noise=float(self.np_random.random()))
        return self._obs(action), reward, solved, False, info

    def _obs(self, said: str) -> str:
        return f"[{said}] count={self.count} target={self.target}"

    def _info(self, task: bool = False) -> dict[str, Any]:
        info: dict[str, Any] = {"state_key": f"{self.count}/{self.target}",
                                "admissible_actions": ["inc", "dec"]}
        if task:
            info["task_id"] = f"counter/{self.target}"
        return info

    def expert_action(self) -> str | None:
        return "inc" if self.count < self.target else "dec"

    def snapshot(self) -> bytes:
        return pickle.dumps((self.count, self.target, self.np_random.bit_generator.state))

    def restore(self, data: bytes) -> None:
        self.count, self.target, state = pickle.loads(data)
        self._np_random = np.random.default_rng()
        self._np_random.bit_generator.state = state


class ReplayCounterEnv(CounterEnv):
    """``CounterEnv`` without snapshot support: the framework forks it by replay."""

    supports_snapshot = False


class CrashyEnv(CounterEnv):
    """Raises ``RuntimeError`` from ``step("crash")``, and from its expert when the target is 99."""

    def step(self, action: str):
        if action == "crash":
            raise RuntimeError("kaboom on purpose")
        return super().step(action)

    def expert_action(self) -> str | None:
        if self.target == 99:
            raise RuntimeError("the expert is lost")
        return super().expert_action()


class SlowEnv(CounterEnv):
    """``step("sleep")`` blocks for ``delay_s`` seconds (a stuck or slow env).

    Tests of in-process servers wait on ``wait_for_sleeps`` to know that a slow step is running."""

    _sleeps_started = 0
    _sleep_started = threading.Condition()

    def __init__(self, span: int = 4, delay_s: float = 1.0) -> None:
        super().__init__(span)
        if delay_s < 0:
            raise ConfigError(f"delay_s must be >= 0, got {delay_s}")
        self.delay_s = delay_s

    @classmethod
    def sleeps_started(cls) -> int:
        """How many ``step("sleep")`` calls have begun in this process so far."""
        with cls._sleep_started:
            return cls._sleeps_started

    @classmethod
    def wait_for_sleeps(cls, count: int, timeout_s: float = 30.0) -> bool:
        """Block until ``count`` sleeping steps have begun (False when ``timeout_s`` passed first)."""
        with cls._sleep_started:
            return cls._sleep_started.wait_for(lambda: cls._sleeps_started >= count, timeout_s)

    def step(self, action: str):
        if action == "sleep":
            with SlowEnv._sleep_started:
                SlowEnv._sleeps_started += 1
                SlowEnv._sleep_started.notify_all()
            time.sleep(self.delay_s)
            action = "inc"
        return super().step(action)


agentgym.register("test/http-counter-v0", CounterEnv, description="counter (tests)", max_turns=8,
                  override=True)
agentgym.register("test/http-counter-replay-v0", ReplayCounterEnv, max_turns=8, override=True)
agentgym.register("test/http-crashy-v0", CrashyEnv, max_turns=8, override=True)
agentgym.register("test/http-slow-v0", SlowEnv, max_turns=8, override=True)

TEST_ENV_IDS = ["test/http-counter-v0", "test/http-counter-replay-v0", "test/http-crashy-v0",
                "test/http-slow-v0"]

# --- in-process services ---------------------------------------------------------------------


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """Train on one torch thread, as the learning tests' numbers were measured (the result of a
    short run depends on the thread count through float summation order)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _the_cache_stays_where_the_run_put_it() -> Iterator[None]:
    """Fails the test that moves or unsets ``AGENTGYM_CACHE`` without restoring it (or the first test after a
    doctest that did): every later test would otherwise build its cache entries, 517 MB for a converted
    model, in the user's ``~/.cache``. The variable is put back so one leak fails one test."""
    for when in ("before", "after"):
        if os.environ.get("AGENTGYM_CACHE") != RUN_CACHE:
            moved = os.environ.get("AGENTGYM_CACHE")
            os.environ["AGENTGYM_CACHE"] = RUN_CACHE
            culprit = "whatever ran before it" if when == "before" else "it"
            pytest.fail(f"AGENTGYM_CACHE was {moved!r} {when} this test, not the run's {RUN_CACHE!r}: "
                        f"{culprit} changed it without restoring it (use monkeypatch.setenv or "
                        f"mock.patch.dict)")
        if when == "before":
            yield


@pytest.fixture
def make_service() -> Iterator[Callable[..., Any]]:
    """``make_service(**create_app_kwargs) -> TestClient`` (lifespan running); all closed after the test."""
    from fastapi.testclient import TestClient

    from agentgym.http.server import create_app

    with contextlib.ExitStack() as stack:

        def factory(env_ids: list[str] | None = None, **kwargs: Any) -> TestClient:
            app = create_app(TEST_ENV_IDS if env_ids is None else env_ids, **kwargs)
            return stack.enter_context(TestClient(app))

        yield factory


@pytest.fixture
def service(make_service: Callable[..., Any]) -> Any:
    """A TestClient of a service with small limits that suit the error tests. The step timeout (1 s) also
    bounds session creation: shorter ones have failed creating a session on a loaded 2-core machine."""
    return make_service(max_sessions=6, max_body_bytes=4096, step_timeout_s=1.0)


class LiveServer:
    """A uvicorn server in a background thread, serving one app on 127.0.0.1."""

    def __init__(self, app: Any, startup_timeout_s: float = 20.0) -> None:
        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))  # bound here, so no other process can take the port meanwhile
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        try:
            wait_healthy(self.url, self.thread, timeout_s=startup_timeout_s, poll_s=0.05)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.sock.close()
        if self.thread.is_alive():
            raise RuntimeError("uvicorn did not shut down within 15 s")


@pytest.fixture
def live_server() -> Iterator[Callable[..., LiveServer]]:
    """``live_server(**create_app_kwargs) -> LiveServer``; every server is shut down after the test."""
    from agentgym.http.server import create_app

    servers: list[LiveServer] = []

    def start(env_ids: list[str] | None = None, **kwargs: Any) -> LiveServer:
        server = LiveServer(create_app(TEST_ENV_IDS if env_ids is None else env_ids, **kwargs))
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture()
def proxy() -> Iterator[Any]:
    """A rollout proxy (``agentgym.harness.RolloutProxy``) on 127.0.0.1, closed after the test."""
    from agentgym.harness import RolloutProxy

    server = RolloutProxy()
    yield server
    server.close()


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    """The default tiny model and its byte tokenizer, built once per module (test files that need another
    shape define their own ``tiny``)."""
    from agentgym.backends.tiny import build_tiny_model

    return build_tiny_model()


# ---------------------------------------------------------------------------------------------------
# A real MCP server (tests/mcp_servers/facts_server.py, fastmcp) for mcp-v0: its tests and the checker's.

#: How long a test server subprocess may take to report its port and listen.
SERVER_START_TIMEOUT_S = 60.0
MCP_FACTS_SERVER = Path(__file__).resolve().parent / "mcp_servers" / "facts_server.py"


def read_port(process: subprocess.Popen[str]) -> int:
    """The port the server printed (``PORT <n>``), within ``SERVER_START_TIMEOUT_S``."""
    found: list[str] = []
    reader = threading.Thread(target=lambda: found.append(process.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(SERVER_START_TIMEOUT_S)
    if not found or not found[0].startswith("PORT "):
        process.kill()
        raise RuntimeError(f"the server did not report its port within {SERVER_START_TIMEOUT_S} s: {found}")
    return int(found[0].split()[1])


def wait_listening(port: int, process: subprocess.Popen[Any]) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"nothing listened on port {port} within {SERVER_START_TIMEOUT_S} s")


def stop_process(process: subprocess.Popen[Any]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


@pytest.fixture(scope="session")
def mcp_facts_url() -> Iterator[str]:
    """The facts MCP server over streamable HTTP on 127.0.0.1, on a port the OS picked."""
    process = subprocess.Popen([sys.executable, str(MCP_FACTS_SERVER), "--http"], stdout=subprocess.PIPE,
                               text=True)
    try:
        port = read_port(process)
        wait_listening(port, process)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop_process(process)


# ---------------------------------------------------------------------------------------------------
# The wheel-and-extras matrix (tests/product/test_extras.py): each test records its row as the user property
# ``extras_matrix``; the process that reports (under xdist, the controller) prints the table at the end.

_EXTRAS_MATRIX: list[dict[str, Any]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call":
        _EXTRAS_MATRIX.extend(value for name, value in report.user_properties if name == "extras_matrix")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _EXTRAS_MATRIX:
        return
    terminalreporter.section("each extra installed alone from the wheel: its smoke command")
    header = f"{'extra':<18} {'result':<15} {'install s':>9} {'total s':>7}  smoke command"
    terminalreporter.write_line(header)
    for row in sorted(_EXTRAS_MATRIX, key=lambda row: row["extra"]):
        terminalreporter.write_line(f"{row['extra']:<18} {row['result']:<15} {row.get('install_s', '-'):>9} "
                                    f"{row['seconds']:>7}  {row['command']}")
