"""Escape attempts: each must fail on the bwrap backend; the subprocess backend's gaps are audited.

Real attacks (unbounded fork bomb, SIGKILL to the parent and to -1, DNS) run on bwrap only; the
audit (``agentgym.sandbox.audit``) runs safe probes of every attack on both backends and is checked
against what each backend is documented to stop. Nothing here targets an address off this machine
except the DNS lookup of example.com, which runs only inside bwrap's empty network namespace.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from agentgym.sandbox import BwrapBackend, Limits, SubprocessBackend
from agentgym.sandbox.audit import ATTACKS, SUBPROCESS_STOPS_AS_ROOT, audit_backend

pytestmark = [pytest.mark.timeout(120)]

FAST = Limits(wall_clock_s=2, memory_mb=256, max_processes=16, output_bytes=16 * 1024)


@pytest.fixture(scope="module")
def bwrap() -> BwrapBackend:
    # bubblewrap is part of the test set-up (`make test` installs it): fail, never skip.
    if not BwrapBackend.available():
        pytest.fail(f"bwrap cannot run here: {BwrapBackend.unavailable_reason()}; install bubblewrap "
                    "(apt-get install bubblewrap) — `make test` does it")
    return BwrapBackend()


def test_audit_bwrap_stops_every_attack(bwrap: BwrapBackend) -> None:
    report = audit_backend(bwrap, wall_clock_s=1.5)
    assert set(report) == set(ATTACKS)
    assert [name for name, stopped in report.items() if not stopped] == []


def test_audit_subprocess_backend_gaps_are_as_documented() -> None:
    report = audit_backend(SubprocessBackend(), wall_clock_s=1.5)
    not_stopped = sorted(name for name, stopped in report.items() if not stopped)
    print("subprocess backend does NOT stop:", not_stopped)
    for name in ("memory_bomb", "cpu_loop", "huge_output", "sleep", "read_env"):
        assert report[name], name  # what rlimits, the wall clock and the scrubbed env do stop
    assert not report["network"] and not report["write_host_tmp"] and not report["read_home"]
    if os.geteuid() == 0:
        assert report == SUBPROCESS_STOPS_AS_ROOT


def test_network_connect_to_host_listener_fails(bwrap: BwrapBackend) -> None:
    accepted: list[object] = []
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        server.settimeout(0.2)
        stop = threading.Event()

        def serve() -> None:
            while not stop.is_set():
                try:
                    accepted.append(server.accept()[0])
                except OSError:
                    pass

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        code = ("import socket\ntry:\n"
                f"    socket.create_connection(('127.0.0.1', {server.getsockname()[1]}), timeout=1)\n"
                "    print('connected')\nexcept OSError as e:\n    print('refused', e)\n")
        result = bwrap.run(code, limits=FAST)
        stop.set()
        thread.join(timeout=2)
    assert result.stdout.startswith("refused") and accepted == []


def test_name_resolution_fails_inside(bwrap: BwrapBackend) -> None:
    code = ("import socket\nfor host in ('example.com', 'localhost'):\n    try:\n"
            "        print(host, socket.getaddrinfo(host, 80))\n    except OSError as e:\n"
            "        print(host, 'failed', e)\n"
            "print(sorted(name for _, name in socket.if_nameindex()))\n")
    lines = bwrap.run(code, limits=FAST).stdout.splitlines()
    assert lines[0].startswith("example.com failed")
    # "localhost" may resolve (to the sandbox's own loopback), but no interface leads out of the box
    assert lines[-1] == "['lo']"


def test_writes_outside_scratch_fail(bwrap: BwrapBackend, tmp_path: Path) -> None:
    project = Path(__file__).resolve().parents[2]
    targets = [Path("/escape-test"), Path("/tmp") / f"escape-{os.getpid()}", project / "escape-test",
               Path.home() / "escape-test", Path("/usr/escape-test"), tmp_path / "escape-test"]
    code = ("import sys\nfor path in sys.stdin.read().split():\n    try:\n"
            "        open(path, 'w').write('x')\n        print('wrote', path)\n"
            "    except OSError as e:\n        print('blocked', path)\n")
    result = bwrap.run(code, "\n".join(map(str, targets)), FAST)
    wrote = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("wrote")]
    assert wrote == [str(targets[1])]  # /tmp inside the sandbox is its own scratch space, not the host's
    assert [path for path in targets if path.exists()] == []


def test_host_environment_and_home_are_invisible(bwrap: BwrapBackend, monkeypatch) -> None:
    monkeypatch.setenv("AGENTGYM_ESCAPE_SECRET", "hunter2-escape")
    code = ("import os, glob\nprint(dict(os.environ))\nfor p in glob.glob('/proc/*/environ'):\n    try:\n"
            "        print(p, open(p, 'rb').read())\n    except OSError:\n        pass\n"
            "print(os.path.exists(os.path.expanduser('~root')), os.listdir('/root'))\n")
    result = bwrap.run(code, limits=FAST)
    assert "hunter2-escape" not in result.stdout + result.stderr
    home_entries = result.stdout.splitlines()[-1]
    assert all(name not in home_entries for name in os.listdir(Path.home()) if name not in (".pyenv",))


def test_proc_of_the_test_process_is_not_readable(bwrap: BwrapBackend, monkeypatch) -> None:
    monkeypatch.setenv("AGENTGYM_ESCAPE_SECRET", "hunter2-proc")
    pid = os.getpid()
    code = (f"import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
            f"for name in ('cmdline', 'environ'):\n    try:\n"
            f"        print(open('/proc/{pid}/' + name, 'rb').read())\n"
            "    except OSError as e:\n        print('blocked', e)\n")
    result = bwrap.run(code, limits=FAST)
    assert "hunter2-proc" not in result.stdout
    pids = eval(result.stdout.splitlines()[0])
    assert max(pids) < 10  # only the sandbox's own PID namespace is visible


def test_command_lines_inside_show_no_framework_source(bwrap: BwrapBackend) -> None:
    # PID 1 (bwrap's reaper) keeps the worker's command line; the worker's own is the same program.
    code = ("import os\nfor pid in ('1', 'self'):\n"
            "    print(repr(open(f'/proc/{pid}/cmdline', 'rb').read().decode()))\n")
    result = bwrap.run(code, limits=FAST)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    for cmdline in lines:
        assert "-I" in cmdline  # it is the worker's command line
        for framework in ("agentgym", "setrlimit", "setuid", "def main", "scratch", "rlimits", "code_bytes"):
            assert framework not in cmdline, (framework, cmdline)
        assert len(cmdline) < 1024, cmdline


def test_fork_bomb_is_bounded_and_host_stays_responsive(bwrap: BwrapBackend) -> None:
    ticks: list[float] = []
    stop = threading.Event()

    def heartbeat() -> None:
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.05)

    thread = threading.Thread(target=heartbeat, daemon=True)
    thread.start()
    started = time.monotonic()
    code = ("import os\nn = 0\nwhile True:\n    try:\n        if os.fork() == 0:\n"
            "            while True:\n                pass\n        n += 1\n    except OSError:\n"
            "        print('capped at', n, flush=True)\n        break\nwhile True:\n    pass\n")
    result = bwrap.run(code, limits=Limits(wall_clock_s=2, max_processes=16))
    elapsed = time.monotonic() - started
    stop.set()
    thread.join(timeout=2)
    assert result.timed_out and elapsed < 10  # the 2 s wall clock held (loose bound: busy CI cores)
    assert result.stdout.startswith("capped at") and int(result.stdout.split()[2]) < 16
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    assert max(gaps) < 1.0  # the test process kept running throughout
    assert _processes_of_uid_range() == []  # every forked child died with the sandbox


def _processes_of_uid_range(settle_s: float = 3.0) -> list[int]:
    """Live processes whose uid is in the sandbox uid range, after up to ``settle_s`` for the kernel
    to finish tearing down the PID namespace (SIGKILL of its init kills the rest asynchronously)."""
    deadline = time.monotonic() + settle_s
    while True:
        found = _scan_uid_range()
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def _scan_uid_range() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                uid = entry.stat().st_uid
            except OSError:
                continue
            if 1_500_000 <= uid < 2_000_000:
                found.append(int(entry.name))
    return found


def test_memory_bomb_fails(bwrap: BwrapBackend) -> None:
    code = "blocks = []\nwhile True:\n    blocks.append(bytearray(32 * 2**20))\n"
    result = bwrap.run(code, limits=FAST)
    assert "MemoryError" in result.stderr and not result.timed_out


def test_infinite_loop_is_stopped_within_the_wall_clock(bwrap: BwrapBackend) -> None:
    started = time.monotonic()
    result = bwrap.run("while True:\n    pass\n", limits=Limits(wall_clock_s=1.5))
    # Loose: busy cores.
    assert result.killed_reason in ("wall_clock", "cpu") and time.monotonic() - started < 10


def test_huge_output_is_capped(bwrap: BwrapBackend) -> None:
    result = bwrap.run("import sys\nwhile True:\n    sys.stdout.write('z' * 65536)\n", limits=FAST)
    assert result.truncated and len(result.stdout) == FAST.output_bytes


def test_sleeping_past_the_wall_clock_is_killed(bwrap: BwrapBackend) -> None:
    started = time.monotonic()
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\ntime.sleep(60)\n"
    result = bwrap.run(code, limits=Limits(wall_clock_s=1))
    assert result.timed_out and time.monotonic() - started < 3
    assert _processes_of_uid_range() == []  # the setsid'd grandchild died too


def test_killing_the_parent_and_everything_hurts_no_one(bwrap: BwrapBackend) -> None:
    code = ("import os, signal\nprint(os.getppid(), flush=True)\nfor pid in (os.getppid(), -1, 1):\n"
            "    try:\n        os.kill(pid, signal.SIGKILL)\n        print('sent', pid, flush=True)\n"
            "    except OSError as e:\n        print('refused', pid, e, flush=True)\n")
    result = bwrap.run(code, limits=FAST)
    assert "sent" not in result.stdout
    # the sandbox still works and this process is alive to check it
    assert bwrap.run("print('ok')", limits=FAST).stdout == "ok\n"


def test_bwrap_probe_reports_a_failure_instead_of_pretending(monkeypatch) -> None:
    from agentgym.sandbox import backends

    backends._probe_bwrap.cache_clear()
    monkeypatch.setattr(backends.shutil, "which", lambda _name: None)
    try:
        assert BwrapBackend.available() is False
        assert "not installed" in BwrapBackend.unavailable_reason()
    finally:
        monkeypatch.undo()
        backends._probe_bwrap.cache_clear()
    assert BwrapBackend.available() is True


# --- the run as a whole: namespaces, disk, tree memory, leftovers, host names -------------------

_SYSCALLS = """
import ctypes, errno, os, platform
libc = ctypes.CDLL(None, use_errno=True)
CLONE, CLONE3 = {"x86_64": (56, 435), "aarch64": (220, 435)}[platform.machine()]
def outcome(ret):
    return "ok" if ret >= 0 else errno.errorcode[ctypes.get_errno()]
flags = {"NEWNS": 0x20000, "NEWCGROUP": 0x02000000, "NEWUTS": 0x04000000, "NEWIPC": 0x08000000,
         "NEWUSER": 0x10000000, "NEWPID": 0x20000000, "NEWNET": 0x40000000}
for name, flag in flags.items():
    print("unshare", name, outcome(libc.unshare(flag)))
    pid = libc.syscall(CLONE, flag | 17, 0, 0, 0, 0)  # 17: SIGCHLD
    if pid == 0:
        os._exit(0)
    print("clone", name, outcome(pid))
    if pid > 0:
        os.waitpid(pid, 0)
print("clone3", outcome(libc.syscall(CLONE3, 0, 0)))
os.mkdir("m")
print("mount", outcome(libc.mount(b"none", b"m", b"tmpfs", 0, b"size=1m")))
print("memfd_create", outcome(libc.syscall({"x86_64": 319, "aarch64": 279}[platform.machine()], b"x", 0)))
print("shmget", outcome(libc.shmget(0, 4096, 0o1000 | 0o600)))
print("io_uring_setup", outcome(libc.syscall(425, 8, ctypes.create_string_buffer(120))))
print("setns", outcome(libc.setns(os.open("/proc/self/ns/net", os.O_RDONLY), 0)))
print("bpf", outcome(libc.syscall({"x86_64": 321, "aarch64": 280}[platform.machine()], 0, 0, 0)))
import subprocess, threading
thread = threading.Thread(target=print, args=("thread", "ok"))
thread.start()
thread.join()
print("subprocess", subprocess.run(["/bin/echo", "ok"], capture_output=True, text=True).stdout.strip())
"""


def test_seccomp_denies_namespaces_mounts_and_hidden_memory(bwrap: BwrapBackend) -> None:
    """Which syscalls the filter denies, each tried for real (namespaces one flag at a time)."""
    result = bwrap.run(_SYSCALLS, limits=FAST)
    answers = dict(line.rsplit(" ", 1) for line in result.stdout.splitlines())
    print(answers)
    for flag in ("NEWNS", "NEWCGROUP", "NEWUTS", "NEWIPC", "NEWUSER", "NEWPID", "NEWNET"):
        assert answers[f"unshare {flag}"] == "EPERM" and answers[f"clone {flag}"] == "EPERM", flag
    assert answers["clone3"] == "ENOSYS"  # so the C library falls back on clone, whose flags are checked
    for name in ("mount", "memfd_create", "shmget", "io_uring_setup", "setns", "bpf"):
        assert answers[name] == "EPERM", name
    # what ordinary code needs still works: threads, fork + exec
    assert answers["thread"] == "ok" and answers["subprocess"] == "ok"


def test_the_issue_attack_nested_userns_tmpfs_fill_is_stopped_at_unshare(bwrap: BwrapBackend) -> None:
    from agentgym.sandbox.audit import _CODE

    result = bwrap.run(_CODE["tmpfs_mount"], limits=FAST)
    assert result.stdout.startswith("blocked unshare Operation not permitted"), result.stdout + result.stderr


def test_disk_fill_stops_at_the_scratch_size_and_host_tmp_is_untouched(bwrap: BwrapBackend) -> None:
    free_before = os.statvfs("/tmp").f_bavail * os.statvfs("/tmp").f_frsize
    code = ("import os\nwritten = 0\ntry:\n    for n in range(1000):\n"
            "        with open(f'/tmp/f{n}', 'wb') as h:\n            for _ in range(8):\n"
            "                h.write(b'x' * 2**20)\n                h.flush()\n"
            "                written += 2**20\nexcept OSError as e:\n    print('stopped', e.errno == 28)\n"
            "print('written', written)\n")
    limits = Limits(wall_clock_s=10, disk_mb=24)
    result = bwrap.run(code, limits=limits)
    assert "stopped True" in result.stdout, result.stdout + result.stderr  # ENOSPC
    written = int(result.stdout.split("written")[1])
    assert 16 * 2**20 <= written <= 24 * 2**20
    assert result.disk_mb == 24
    free_after = os.statvfs("/tmp").f_bavail * os.statvfs("/tmp").f_frsize
    assert free_before - free_after < 16 * 2**20  # nothing of it landed on the host's disk


def _memory_guards() -> list[str]:
    from agentgym.sandbox.cgroup import memory_cgroup_parent

    # The supervisor always; the cgroup wherever this machine delegates one (it decides "auto").
    return ["supervisor"] + (["cgroup"] if memory_cgroup_parent()[0] is not None else [])


@pytest.mark.parametrize("guard", _memory_guards())
def test_tree_memory_is_bounded_as_a_whole(guard: str) -> None:
    if not BwrapBackend.available():
        pytest.fail(f"bwrap cannot run here: {BwrapBackend.unavailable_reason()}")
    backend = BwrapBackend(memory_guard=guard)  # type: ignore[arg-type]
    # 4 children x 200 MiB: each under the 512 MiB per-process limit, together 800 MiB of a 512 MiB run.
    code = ("import os, time\nfor _ in range(4):\n    if os.fork() == 0:\n        b = b'x' * (200 * 2**20)\n"
            "        time.sleep(60)\nprint('forked', flush=True)\ntime.sleep(60)\n")
    started = time.monotonic()
    result = backend.run(code, limits=Limits(wall_clock_s=8, memory_mb=512))
    assert result.killed_reason == "memory" and result.exit_code is None, result
    assert result.memory_guard == guard
    assert time.monotonic() - started < 6  # killed when it went over, not at the wall clock
    assert _processes_of_uid_range() == []


def test_children_of_a_finished_program_do_not_outlive_it(bwrap: BwrapBackend) -> None:
    tag = f"41.{os.getpid() % 10**6:06d}"
    code = (f"import os\nif os.fork() == 0:\n    os.setsid()\n"
            f"    os.execv('/bin/sleep', ['sleep', '{tag}'])\n"
            f"if os.fork() == 0:\n    os.execv('/bin/sleep', ['sleep', '{tag}'])\nprint('bye')\n")
    result = bwrap.run(code, limits=FAST)
    assert result.stdout == "bye\n" and result.exit_code == 0
    from agentgym.sandbox.audit import _wait_gone

    assert not _wait_gone(f"sleep\0{tag}\0".encode())


def test_no_host_name_or_path_in_hostname_pid1_or_mounts(bwrap: BwrapBackend) -> None:
    code = ("import socket\nprint(socket.gethostname())\nprint(open('/proc/1/cmdline', 'rb').read())\n"
            "print(open('/proc/self/mountinfo').read())\n")
    result = bwrap.run(code, limits=FAST)
    lines = result.stdout.splitlines()
    assert lines[0] == "sandbox"
    pid1 = lines[1]
    assert "--ro-bind" not in pid1 and "--setenv" not in pid1 and "agentgym-sandbox" not in pid1
    assert "agentgym-sandbox" not in result.stdout  # the scratch is a tmpfs, not a host dir
    assert socket.gethostname() not in lines[:2] or socket.gethostname() == "sandbox"
