"""Starting local services: ``free_port``, ``wait_healthy``, ``start_service``, ``stop_service``."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest

from agentgym.errors import RemoteEnvError
from agentgym.service_kit.launcher import free_port, start_service, stop_service, wait_healthy

pytestmark = pytest.mark.timeout(120)


def test_wait_healthy_gives_up_in_time_and_names_the_last_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(RemoteEnvError, match=r"not healthy within 0.5 s \(last: ConnectError"):
        wait_healthy(url, timeout_s=0.5)
    assert time.monotonic() - started < 10  # bounded by timeout_s, not by the poll count
    ended = threading.Thread(target=lambda: None)
    ended.start()
    ended.join()
    with pytest.raises(RemoteEnvError, match="its thread ended"):
        wait_healthy(url, ended, timeout_s=30)


def test_start_service_reports_a_process_that_exits_and_stop_kills_a_stubborn_one() -> None:
    with pytest.raises(RemoteEnvError, match="exited with code 3"):
        start_service([sys.executable, "-c", "import sys; sys.exit(3)"], f"http://127.0.0.1:{free_port()}")
    ignores_sigterm = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                       "print('ready', flush=True)\ntime.sleep(60)")
    with subprocess.Popen([sys.executable, "-c", ignores_sigterm], stdout=subprocess.PIPE) as stubborn:
        assert stubborn.stdout.readline() == b"ready\n"  # SIGTERM is ignored from here on
        assert stop_service(stubborn, timeout_s=0.5) == -signal.SIGKILL
        assert stop_service(stubborn) == -signal.SIGKILL  # stopping a stopped process is fine
