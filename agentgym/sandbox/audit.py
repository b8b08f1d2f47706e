"""``audit_backend``: run a fixed set of escape attempts on a backend and report which it stops.

Every attack is safe to run on *any* backend, including the insecure ``subprocess`` one: the
destructive ones are probes (signal 0 instead of SIGKILL, a fork bomb capped at ``_FORK_PROBE``
children that sleep, writes to uniquely named files that are deleted afterwards), and nothing
targets an address off this machine (the network attack connects to a listener the audit itself
opens on 127.0.0.1). ``tests/sandbox/test_sandbox_escape.py`` runs the real, unbounded versions on bwrap.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from agentgym.sandbox.backends import Backend, _python_prefixes
from agentgym.sandbox.limits import Limits, Result

_FORK_PROBE = 100
ATTACKS = (
    "network", "write_root", "write_host_tmp", "write_project", "write_home", "read_env", "read_home",
    "proc_snoop", "fork_bomb", "memory_bomb", "cpu_loop", "huge_output", "sleep", "signal_parent",
    "signal_all", "nested_namespace", "tmpfs_mount", "disk_fill", "tree_memory", "leftover_children",
    "host_layout",
)

#: What the subprocess backend stops when the host runs as root (measured; see the escape tests).
SUBPROCESS_STOPS_AS_ROOT = {
    "network": False, "write_root": False, "write_host_tmp": False, "write_project": False,
    "write_home": False, "read_env": True, "read_home": False, "proc_snoop": False, "fork_bomb": False,
    "memory_bomb": True, "cpu_loop": True, "huge_output": True, "sleep": True, "signal_parent": False,
    "signal_all": False, "nested_namespace": False, "tmpfs_mount": False, "disk_fill": False,
    "tree_memory": True, "leftover_children": True, "host_layout": False,
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
    # A user namespace (with a mount namespace: never the host's mounts) gives every capability in it.
    "nested_namespace": """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x10000000 | 0x00020000) == 0:
    print("unshared")
else:
    print("blocked", os.strerror(ctypes.get_errno()))
""",
    # The attack: a tmpfs mounted in a nested namespace is host RAM that no rlimit counts.
    # The probe mounts one on a dir of its own scratch and writes 1 MiB to it.
    "tmpfs_mount": """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
uid, gid = os.getuid(), os.getgid()
os.mkdir("mnt")
if libc.unshare(0x10000000 | 0x00020000) != 0:
    print("blocked unshare", os.strerror(ctypes.get_errno()))
else:
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w") as handle:
            handle.write(text)
    if libc.mount(b"none", b"mnt", b"tmpfs", 0, b"size=4m") != 0:
        print("blocked mount", os.strerror(ctypes.get_errno()))
    else:
        with open("mnt/fill", "wb") as handle:
            handle.write(b"x" * 2**20)
        print("mounted")
""",
    "disk_fill": """
import json, os, sys
target = json.load(sys.stdin)["bytes"]
written, chunk = 0, b"x" * 2**20
try:
    for number in range(10_000):
        with open(f"fill{number}.bin", "wb") as handle:
            for _ in range(8):  # 8 MiB per file, under RLIMIT_FSIZE
                if written >= target:
                    break
                handle.write(chunk)
                handle.flush()
                written += len(chunk)
        if written >= target:
            break
except OSError as exc:
    print("stopped", exc)
print("written", written, flush=True)
""",
    "tree_memory": """
import json, os, sys, time
params = json.load(sys.stdin)
for _ in range(params["children"]):
    if os.fork() == 0:
        block = b"x" * (params["mb"] * 2**20)  # bytes: every page written, so resident
        time.sleep(30)
        os._exit(0)
print("forked", flush=True)
time.sleep(30)
""",
    # Children that outlive the program: it exits at once, they sleep (as `sleep TAG`, to be found).
    "leftover_children": """
import json, os, sys
tag = json.load(sys.stdin)["tag"]
for _ in range(2):
    if os.fork() == 0:
        os.execv("/bin/sleep", ["sleep", tag])
print("forked", flush=True)
""",
    "host_layout": """
import socket
print(socket.gethostname())
print(open("/proc/1/cmdline", "rb").read())
print(open("/proc/self/mountinfo").read())
""",
}


def _audit_containment(backend: Backend, limits: Limits) -> dict[str, bool]:
    """The attacks on the run's totals (namespaces, disk, tree memory) and on what outlives it."""
    stopped: dict[str, bool] = {}
    stopped["nested_namespace"] = "unshared" not in backend.run(_CODE["nested_namespace"], "", limits).stdout
    stopped["tmpfs_mount"] = "mounted" not in backend.run(_CODE["tmpfs_mount"], "", limits).stdout
    disk = Limits(**{**dataclasses.asdict(limits), "disk_mb": 16,
                     "wall_clock_s": max(limits.wall_clock_s, 3.0)})
    result = backend.run(_CODE["disk_fill"], json.dumps({"bytes": 2 * disk.disk_mb * 2**20}), disk)
    written = [int(line.split()[1]) for line in result.stdout.splitlines() if line.startswith("written")]
    stopped["disk_fill"] = bool(written) and written[0] <= disk.disk_mb * 2**20
    # Four children of 100 MiB each: every one fits the per-process limit, together they do not.
    tree = Limits(**{**dataclasses.asdict(limits), "wall_clock_s": max(limits.wall_clock_s, 3.0)})
    result = backend.run(_CODE["tree_memory"], json.dumps({"children": 4, "mb": 100}), tree)
    stopped["tree_memory"] = result.killed_reason == "memory"
    tag = f"{30 + secrets.randbelow(30)}.{secrets.randbelow(10**6):06d}"
    backend.run(_CODE["leftover_children"], json.dumps({"tag": tag}), limits)
    stopped["leftover_children"] = not _wait_gone(f"sleep\0{tag}\0".encode())
    result = backend.run(_CODE["host_layout"], "", limits)
    lines = result.stdout.splitlines()
    # The Python install is bound at its host path (the interpreter is PID 1's program): that path is
    # expected; any other host path (bwrap's options, a scratch dir under the host's temp dir) is not.
    shown = result.stdout
    for prefix in sorted(_python_prefixes(getattr(backend, "python", sys.executable)), key=len, reverse=True):
        shown = shown.replace(prefix, "<python>")
    stopped["host_layout"] = bool(lines) and lines[0] != socket.gethostname() and not any(
        marker in shown for marker in ("--ro-bind", "agentgym-sandbox-", tempfile.gettempdir() + "/"))
    return stopped


def _wait_gone(cmdline: bytes, settle_s: float = 2.0) -> bool:
    """Whether a process with exactly this command line still runs after ``settle_s`` (kills it if so)."""
    deadline = time.monotonic() + settle_s
    while True:
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if (entry / "cmdline").read_bytes() == cmdline:
                        found.append(int(entry.name))
                except OSError:
                    continue
        if not found or time.monotonic() > deadline:
            for pid in found:  # the audit leaves nothing running, whatever the backend let through
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            return bool(found)
        time.sleep(0.05)


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

        def run(name: str, params: dict[str, Any]) -> Result:
            return backend.run(_CODE[name], json.dumps(params), limits)

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
        children = [int(line.split()[1]) for line in result.stdout.splitlines()
                    if line.startswith("children")]
        stopped["fork_bomb"] = bool(children) and children[0] < limits.max_processes
        result = run("memory_bomb", {"bytes": 2 * limits.memory_mb * 1024 * 1024})
        stopped["memory_bomb"] = "allocated" not in result.stdout
        for name in ("cpu_loop", "sleep"):
            result = run(name, {})
            stopped[name] = (result.killed_reason in ("wall_clock", "cpu")
                             and result.wall_s < wall_clock_s + 1.5)
        result = run("huge_output", {})
        stopped["huge_output"] = result.truncated and len(result.stdout.encode()) <= limits.output_bytes
        result = run("signal_parent", {"pid": os.getpid()})
        stopped["signal_parent"] = "could signal" not in result.stdout
        result = run("signal_all", {})
        stopped["signal_all"] = "could signal" not in result.stdout
        stopped.update(_audit_containment(backend, limits))
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
