"""``audit_backend``: run a fixed set of escape attempts on a backend and report which it stops.

Every attack is safe to run on *any* backend, including the insecure ``subprocess`` one: the
destructive ones are probes (signal 0 instead of SIGKILL, a fork bomb capped at ``_FORK_PROBE``
children that sleep, writes to uniquely named files that are deleted afterwards), and nothing
targets an address off this machine (the network attack connects to a listener the audit itself
opens on 127.0.0.1). ``tests/test_sandbox_escape.py`` runs the real, unbounded versions on bwrap.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentgym.sandbox.backends import Backend, Limits, Result

_FORK_PROBE = 100
ATTACKS = (
    "network", "write_root", "write_host_tmp", "write_project", "write_home", "read_env", "read_home",
    "proc_snoop", "fork_bomb", "memory_bomb", "cpu_loop", "huge_output", "sleep", "signal_parent",
    "signal_all",
)

#: What the subprocess backend stops when the host runs as root (measured; see the escape tests).
SUBPROCESS_STOPS_AS_ROOT = {
    "network": False, "write_root": False, "write_host_tmp": False, "write_project": False,
    "write_home": False, "read_env": True, "read_home": False, "proc_snoop": False, "fork_bomb": False,
    "memory_bomb": True, "cpu_loop": True, "huge_output": True, "sleep": True, "signal_parent": False,
    "signal_all": False,
}

_WRITE = """
import json, sys
for path in json.load(sys.stdin)["paths"]:
    try:
        with open(path, "w") as handle:
            handle.write("escaped")
        print("wrote", path)
    except OSError as exc:
        print("blocked", path, exc)
"""

_CODE: dict[str, str] = {
    "network": """
import json, socket, sys
port = json.load(sys.stdin)["port"]
try:
    socket.create_connection(("127.0.0.1", port), timeout=1).close()
    print("connected")
except OSError as exc:
    print("blocked", exc)
""",
    "read_env": """
import os
print(dict(os.environ))
print(open("/proc/self/environ", "rb").read())
""",
    "read_home": """
import json, sys
try:
    print(open(json.load(sys.stdin)["path"]).read())
except OSError as exc:
    print("blocked", exc)
""",
    "proc_snoop": """
import json, sys
pid = json.load(sys.stdin)["pid"]
for name in ("cmdline", "environ"):
    try:
        print(name, open(f"/proc/{pid}/{name}", "rb").read())
    except OSError as exc:
        print("blocked", name, exc)
""",
    "fork_bomb": f"""
import os, time
children = 0
for _ in range({_FORK_PROBE}):
    try:
        if os.fork() == 0:
            time.sleep(2)
            os._exit(0)
        children += 1
    except OSError:
        break
print("children", children, flush=True)
""",
    "memory_bomb": """
import json, sys
block = bytearray(json.load(sys.stdin)["bytes"])
print("allocated", len(block))
""",
    "cpu_loop": "while True:\n    pass\n",
    "huge_output": "while True:\n    print('x' * 4096)\n",
    "sleep": "import time\ntime.sleep(60)\nprint('woke')\n",
    "signal_parent": """
import json, os, sys
host = json.load(sys.stdin)["pid"]
for pid in (os.getppid(), host):
    try:
        os.kill(pid, 0)  # signal 0: the permission check of a kill, with no effect
        print("could signal", pid)
    except OSError as exc:
        print("blocked", pid, exc)
""",
    "signal_all": """
import os
try:
    os.kill(-1, 0)
    print("could signal every process")
except OSError as exc:
    print("blocked", exc)
""",
}


class _Listener:
    """A TCP listener on 127.0.0.1 that counts connections (the network attack's target)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()


def audit_backend(backend: Backend, *, wall_clock_s: float = 2.0,
                  project_dir: str | os.PathLike[str] | None = None) -> dict[str, bool]:
    """Try every attack in ``ATTACKS`` on ``backend``; ``True`` where the backend stopped it.

    Args:
        backend: the backend to audit.
        wall_clock_s: wall clock of each attack (the loop and sleep attacks use all of it).
        project_dir: a host dir the code must not write to (default: the agentgym checkout).

    Returns:
        ``{attack: stopped}`` for every name in ``ATTACKS``.
    """
    token = secrets.token_hex(8)
    secret = f"agentgym-audit-secret-{token}"
    limits = Limits(wall_clock_s=wall_clock_s, memory_mb=256, max_processes=16, output_bytes=16 * 1024)
    project = Path(project_dir) if project_dir is not None else Path(__file__).resolve().parents[2]
    targets = {
        "write_root": Path("/") / f"agentgym-audit-{token}",
        "write_host_tmp": Path(tempfile.gettempdir()) / f"agentgym-audit-{token}",
        "write_project": project / f"agentgym-audit-{token}",
        "write_home": Path.home() / f"agentgym-audit-{token}",
    }
    home_file = Path.home() / f".agentgym-audit-read-{token}"
    listener = _Listener()
    previous = os.environ.get("AGENTGYM_AUDIT_SECRET")
    os.environ["AGENTGYM_AUDIT_SECRET"] = secret
    try:
        home_file.write_text(secret)
        run: Callable[[str, dict[str, Any]], Result] = lambda name, params: backend.run(
            _CODE[name], json.dumps(params), limits)
        stopped: dict[str, bool] = {}
        result = run("network", {"port": listener.port})
        stopped["network"] = "connected" not in result.stdout and listener.accepted == 0
        for name, path in targets.items():
            backend.run(_WRITE, json.dumps({"paths": [str(path)]}), limits)
            stopped[name] = not path.exists()
        result = run("read_env", {})
        stopped["read_env"] = secret not in result.stdout + result.stderr
        result = run("read_home", {"path": str(home_file)})
        stopped["read_home"] = secret not in result.stdout
        host_cmdline = Path("/proc/self/cmdline").read_bytes()
        result = run("proc_snoop", {"pid": os.getpid()})
        stopped["proc_snoop"] = secret not in result.stdout and repr(host_cmdline) not in result.stdout
        result = run("fork_bomb", {})
        children = [int(line.split()[1]) for line in result.stdout.splitlines() if line.startswith("children")]
        stopped["fork_bomb"] = bool(children) and children[0] < limits.max_processes
        result = run("memory_bomb", {"bytes": 2 * limits.memory_mb * 1024 * 1024})
        stopped["memory_bomb"] = "allocated" not in result.stdout
        for name in ("cpu_loop", "sleep"):
            result = run(name, {})
            stopped[name] = result.killed_reason in ("wall_clock", "cpu") and result.wall_s < wall_clock_s + 1.5
        result = run("huge_output", {})
        stopped["huge_output"] = result.truncated and len(result.stdout.encode()) <= limits.output_bytes
        result = run("signal_parent", {"pid": os.getpid()})
        stopped["signal_parent"] = "could signal" not in result.stdout
        result = run("signal_all", {})
        stopped["signal_all"] = "could signal" not in result.stdout
        return {name: stopped[name] for name in ATTACKS}
    finally:
        listener.close()
        for path in [*targets.values(), home_file]:
            try:
                path.unlink()
            except OSError:
                pass
        if previous is None:
            os.environ.pop("AGENTGYM_AUDIT_SECRET", None)
        else:
            os.environ["AGENTGYM_AUDIT_SECRET"] = previous
