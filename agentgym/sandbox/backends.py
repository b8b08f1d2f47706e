"""Sandbox backends that run untrusted Python outside the caller's process: ``Limits``, ``Result``,
``BwrapBackend``, ``SubprocessBackend``, ``DockerBackend``, ``default_backend`` and ``run_code``.

Every backend starts a *worker*: a sandboxed interpreter running ``bootstrap.py`` that waits on
stdin for one request (code + stdin + limits), applies the limits, and runs the code. Limits are
applied inside the worker after the request arrives, so the same worker can be spawned ahead of
time (``agentgym.sandbox.pool.WarmPool``). A worker serves one request and is then discarded.

What bounds what, on the ``bwrap`` backend (measured in ``tests/test_sandbox_escape.py``):

- wall clock: the host kills bwrap's process group when ``wall_clock_s`` runs out; bwrap's
  ``--die-with-parent`` and the PID namespace then take every process of the sandbox with it.
- CPU / memory / files / open files: rlimits (``RLIMIT_CPU``, ``RLIMIT_AS``, ``RLIMIT_FSIZE``,
  ``RLIMIT_NOFILE``), per process.
- processes (fork bombs): ``RLIMIT_NPROC`` counts the processes of a *kernel* uid, and the kernel
  exempts uid 0 entirely — also inside a user namespace mapped to root, which is what bwrap makes
  when run by root. So when the host runs as root, bwrap runs in its privileged mode (no user
  namespace) and the worker drops to a fresh, random, otherwise unused uid before the code runs:
  ``RLIMIT_NPROC`` then bounds that sandbox alone. Run by a non-root user, bwrap makes a user
  namespace and the per-namespace process count (Linux >= 5.14) does the same job.
- total memory of a process tree: not bounded beyond ``max_processes * memory_mb`` (rlimits are
  per process); the docker backend's cgroup (``--memory``) is the one hard total.
"""

from __future__ import annotations

import functools
import json
import os
import pwd
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal, Protocol

from agentgym.errors import ConfigError

KilledReason = Literal["wall_clock", "output_limit", "cpu", "signal"]

#: Inside the sandbox the scratch dir is mounted here (bwrap, docker).
SANDBOX_SCRATCH = "/scratch"
_BOOTSTRAP_SOURCE = (Path(__file__).with_name("bootstrap.py")).read_text(encoding="utf-8")
#: Fresh uids for sandboxes run by root: far above any real account, never two live at once.
_UID_RANGE = (1_500_000, 1_999_999)
_READ_CHUNK = 65536
#: After the program exits, how long to wait for pipes held open by its leftover children.
_EXIT_GRACE_S = 0.2


@dataclass(frozen=True)
class Limits:
    """Resource limits for one run. Every field is a hard limit; ``None`` means the default rule.

    Example:
        >>> Limits(wall_clock_s=2).cpu_limit_s
        3
        >>> Limits(memory_mb=0)
        Traceback (most recent call last):
        ...
        agentgym.errors.ConfigError: Limits.memory_mb must be > 0, got 0
    """

    wall_clock_s: float = 5.0
    """Wall-clock budget of the run, enforced from outside: the whole sandbox is killed at the end."""
    cpu_s: int | None = None
    """CPU seconds per process (``RLIMIT_CPU``); ``None``: ``ceil(wall_clock_s) + 1``."""
    memory_mb: int = 512
    """Address space per process in MiB (``RLIMIT_AS``); a bigger allocation raises ``MemoryError``."""
    max_processes: int = 32
    """Processes and threads of the sandbox (``RLIMIT_NPROC`` of its own uid; see the module doc)."""
    output_bytes: int = 64 * 1024
    """Cap on stdout + stderr together; past it the output is truncated, flagged, and the run killed."""
    file_size_mb: int = 16
    """Largest file the code may write (``RLIMIT_FSIZE``)."""
    open_files: int = 64
    """Open file descriptors per process (``RLIMIT_NOFILE``)."""

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"Limits.{item.name} must be > 0, got {value!r}")

    @property
    def cpu_limit_s(self) -> int:
        """The ``RLIMIT_CPU`` soft limit in seconds."""
        return int(self.cpu_s) if self.cpu_s is not None else int(-(-self.wall_clock_s // 1)) + 1

    def rlimits(self) -> list[tuple[str, int, int]]:
        """``(name, soft, hard)`` for ``resource.setrlimit`` inside the worker."""
        memory = int(self.memory_mb) * 1024 * 1024
        file_size = int(self.file_size_mb) * 1024 * 1024
        cpu = self.cpu_limit_s
        return [
            ("RLIMIT_CORE", 0, 0),
            ("RLIMIT_AS", memory, memory),
            ("RLIMIT_CPU", cpu, cpu + 1),  # SIGXCPU at the soft limit, SIGKILL a second later
            ("RLIMIT_FSIZE", file_size, file_size),
            ("RLIMIT_NOFILE", int(self.open_files), int(self.open_files)),
            ("RLIMIT_NPROC", int(self.max_processes), int(self.max_processes)),
        ]


@dataclass(frozen=True)
class Result:
    """What one run produced."""

    stdout: str
    """Standard output (UTF-8, undecodable bytes replaced), at most ``Limits.output_bytes`` with stderr."""
    stderr: str
    """Standard error, same rules."""
    exit_code: int | None
    """The program's exit status; ``-N`` when signal N ended it; ``None`` when the host killed it."""
    timed_out: bool
    """The wall clock ran out and the sandbox was killed."""
    killed_reason: KilledReason | None
    """Why the run was cut short: ``wall_clock``, ``output_limit``, ``cpu`` (``RLIMIT_CPU``), ``signal``."""
    wall_s: float
    """Seconds from sending the code to the end of the run."""
    truncated: bool
    """The output went past ``Limits.output_bytes`` and was cut."""
    backend: str = ""
    """Name of the backend that ran it."""

    def to_dict(self) -> dict[str, object]:
        return {item.name: getattr(self, item.name) for item in fields(self)}


def encode_request(code: str, stdin: str | bytes, limits: Limits, *, scratch: str,
                   uid: int | None) -> bytes:
    """The bytes a worker reads on stdin (format in ``bootstrap.py``)."""
    code_bytes = code.encode("utf-8", "surrogatepass")
    stdin_bytes = stdin.encode("utf-8", "surrogatepass") if isinstance(stdin, str) else bytes(stdin)
    header = {
        "code_bytes": len(code_bytes), "stdin_bytes": len(stdin_bytes), "scratch": scratch,
        "rlimits": limits.rlimits(), "uid": uid, "gid": uid,
    }
    return json.dumps(header).encode() + b"\n" + code_bytes + stdin_bytes


def _scrubbed_env(home: str) -> dict[str, str]:
    """The only environment sandboxed code sees."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8",
    }


def _fresh_uid() -> int:
    """A random uid no account uses; collisions between live sandboxes are ~1 in 500,000."""
    low, high = _UID_RANGE
    while True:
        uid = low + secrets.randbelow(high - low)
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid


class Worker:
    """One spawned sandboxed interpreter waiting for its single request."""

    def __init__(self, proc: subprocess.Popen[bytes], scratch_host: Path, scratch_inside: str,
                 uid: int | None, backend: str) -> None:
        self.proc = proc
        self.scratch_host = scratch_host
        self.scratch_inside = scratch_inside
        self.uid = uid
        self.backend = backend
        self.spawned_at = time.monotonic()
        self._done = False

    def alive(self) -> bool:
        return not self._done and self.proc.poll() is None

    def execute(self, code: str, stdin: str | bytes, limits: Limits) -> Result:
        """Send the request, supervise the run, clean up. A worker executes at most once."""
        if self._done:
            raise RuntimeError("a sandbox worker runs one request only")
        self._done = True
        try:
            frame = encode_request(code, stdin, limits, scratch=self.scratch_inside, uid=self.uid)
            return _supervise(self.proc, frame, limits, self.kill, self.backend)
        finally:
            self.discard()

    def kill(self) -> None:
        """Kill the worker's whole process group (bwrap's PID namespace goes with it)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def discard(self) -> None:
        """Kill whatever is left, reap, and delete the scratch dir."""
        self._done = True
        if self.proc.poll() is None:
            self.kill()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # cannot happen after SIGKILL short of a kernel hang
            pass
        shutil.rmtree(self.scratch_host, ignore_errors=True)


def _supervise(proc: subprocess.Popen[bytes], frame: bytes, limits: Limits, kill: object,
               backend: str) -> Result:
    """Feed ``frame`` to the worker and collect its output under the wall clock and output cap."""
    start = time.monotonic()
    deadline = start + limits.wall_clock_s
    cap = int(limits.output_bytes)
    out = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}  # type: ignore[union-attr]
    total = 0
    truncated = False
    killed: KilledReason | None = None
    pending = memoryview(frame)
    selector = selectors.DefaultSelector()
    stdin_fd = proc.stdin.fileno()  # type: ignore[union-attr]
    os.set_blocking(stdin_fd, False)
    selector.register(stdin_fd, selectors.EVENT_WRITE)
    for fd in out:
        selector.register(fd, selectors.EVENT_READ)
    open_reads = set(out)
    exited_at: float | None = None
    try:
        while open_reads or pending is not None:
            now = time.monotonic()
            if now >= deadline:
                killed = "wall_clock"
                break
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > _EXIT_GRACE_S:
                break  # the program is done; whatever still holds its pipes is killed below
            for key, _ in selector.select(timeout=min(deadline - now, 0.05)):
                fd = key.fd
                if fd == stdin_fd:
                    try:
                        written = os.write(fd, pending)
                        pending = pending[written:]
                    except (BrokenPipeError, OSError):
                        pending = memoryview(b"")
                    if not pending:
                        pending = None  # type: ignore[assignment]
                        selector.unregister(fd)
                        proc.stdin.close()  # type: ignore[union-attr]
                    continue
                chunk = os.read(fd, _READ_CHUNK)
                if not chunk:
                    selector.unregister(fd)
                    open_reads.discard(fd)
                    continue
                room = cap - total
                if len(chunk) > room:
                    out[fd] += chunk[:max(room, 0)]
                    total = cap
                    truncated = True
                    killed = "output_limit"
                    break
                out[fd] += chunk
                total += len(chunk)
            if killed is not None:
                break
    finally:
        selector.close()
    if killed is not None or proc.poll() is None:
        kill()  # type: ignore[operator]
    try:
        returncode = proc.wait(timeout=max(deadline - time.monotonic(), 0) + 1)
    except subprocess.TimeoutExpired:
        kill()  # type: ignore[operator]
        returncode = proc.wait(timeout=5)
    wall_s = time.monotonic() - start
    exit_code: int | None = returncode
    if killed is not None:
        exit_code = None
    else:
        # bwrap reports a signal death of the program as 128 + N; a plain child as -N.
        signum = -returncode if returncode < 0 else (returncode - 128 if backend == "bwrap" and returncode > 128
                                                      else 0)
        if signum > 0:
            exit_code = -signum
            killed = "cpu" if signum == signal.SIGXCPU or (
                signum == signal.SIGKILL and wall_s >= limits.cpu_limit_s) else "signal"
    stdout, stderr = (bytes(buffer).decode("utf-8", "replace") for buffer in out.values())
    return Result(stdout=stdout, stderr=stderr, exit_code=exit_code, timed_out=killed == "wall_clock",
                  killed_reason=killed, wall_s=round(wall_s, 4), truncated=truncated, backend=backend)


class Backend(Protocol):
    """A way to start sandboxed workers.

    Contract: ``spawn()`` returns a ``Worker`` whose process runs ``bootstrap.py`` and waits for one
    request; it must not run anything of the caller's before that. ``secure`` says whether the
    backend is meant as a security boundary (only those may run untrusted code by default).
    """

    name: str
    secure: bool

    def spawn(self) -> Worker: ...

    def run(self, code: str, stdin: str | bytes = "", limits: Limits | None = None) -> Result: ...


class _BackendBase:
    name = "base"
    secure = False

    def __init__(self, *, python: str | None = None, scratch_root: str | os.PathLike[str] | None = None) -> None:
        self.python = python or sys.executable
        self.scratch_root = Path(scratch_root) if scratch_root is not None else None

    def _make_scratch(self, uid: int | None) -> Path:
        scratch = Path(tempfile.mkdtemp(prefix="agentgym-sandbox-", dir=self.scratch_root))
        os.chmod(scratch, 0o700)
        if uid is not None:
            os.chown(scratch, uid, uid)
        return scratch

    def spawn(self) -> Worker:
        raise NotImplementedError

    def run(self, code: str, stdin: str | bytes = "", limits: Limits | None = None) -> Result:
        """Run ``code`` in a freshly spawned worker (see ``run_code``)."""
        return self.spawn().execute(code, stdin, limits or Limits())

    def _popen(self, argv: list[str], env: dict[str, str], cwd: str | None = None) -> subprocess.Popen[bytes]:
        return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env, cwd=cwd, start_new_session=True, close_fds=True)


class BwrapBackend(_BackendBase):
    """bubblewrap: new mount, PID, network, IPC, UTS and cgroup namespaces; the security boundary.

    Inside: read-only ``/usr`` (and the ``/lib*``, ``/bin`` links), the Python install read-only
    (``sys.prefix`` and ``sys.base_prefix``), fresh ``/proc`` and ``/dev``, the scratch dir read-write
    at ``/scratch`` (also ``$HOME``, ``$TMPDIR`` and ``/tmp``), nothing else: no ``/etc``, no
    project dir, no host ``/tmp``. No network but the namespace's own loopback. The environment is
    ``--clearenv`` plus ``_scrubbed_env``. As root, the code runs as a fresh unprivileged uid with
    no capabilities (see the module doc for why).

    ``/tmp`` is the scratch dir rather than a tmpfs: a tmpfs is host memory that ``RLIMIT_AS``
    does not count, so many files there could fill the host's RAM.
    """

    name = "bwrap"
    secure = True

    def __init__(self, *, bwrap: str = "bwrap", python: str | None = None,
                 scratch_root: str | os.PathLike[str] | None = None) -> None:
        super().__init__(python=python, scratch_root=scratch_root)
        self.bwrap = shutil.which(bwrap) or bwrap
        self.as_root = os.geteuid() == 0

    @classmethod
    def available(cls) -> bool:
        """Whether bwrap is installed *and* a probe sandbox really runs here (cached)."""
        return _probe_bwrap()[0]

    @classmethod
    def unavailable_reason(cls) -> str:
        """Why ``available()`` is False (the probe's error), or ``""``."""
        return _probe_bwrap()[1]

    def argv(self, scratch: Path) -> list[str]:
        """The bwrap command line for a worker whose host scratch dir is ``scratch``."""
        args = [self.bwrap, "--die-with-parent", "--new-session"]
        if self.as_root:
            # Privileged mode without a user namespace, so the code can run as a real unprivileged
            # uid (RLIMIT_NPROC exempts kernel uid 0). Only setuid/setgid survive, for that drop.
            args += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup",
                     "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        else:
            args += ["--unshare-all", "--unshare-user"]
        args += ["--ro-bind", "/usr", "/usr"]
        for link in ("lib", "lib64", "bin", "sbin"):
            path = Path("/") / link
            if path.is_symlink():
                args += ["--symlink", os.readlink(path), str(path)]
            elif path.is_dir():
                args += ["--ro-bind", str(path), str(path)]
        # /tmp and the scratch dir first: the Python install may live under /tmp (a checkout in
        # /tmp with its venv), and a later --bind over /tmp would hide it.
        args += ["--proc", "/proc", "--dev", "/dev",
                 "--bind", str(scratch), SANDBOX_SCRATCH, "--bind", str(scratch / ".tmp"), "/tmp"]
        made: set[str] = set()
        for prefix in _python_prefixes(self.python):
            if prefix.startswith("/usr/"):
                continue
            # Parents bwrap would create with the host's umask (e.g. /root as 0700, which the
            # sandbox uid could not traverse): create them world-traversable first.
            for parent in reversed(Path(prefix).parents):
                if str(parent) not in ("/", "/tmp") and str(parent) not in made:
                    made.add(str(parent))
                    args += ["--perms", "0755", "--dir", str(parent)]
            args += ["--ro-bind", prefix, prefix]
        args += ["--chdir", "/", "--clearenv"]  # the worker enters /scratch once it is the sandbox user
        for key, value in _scrubbed_env(SANDBOX_SCRATCH).items():
            args += ["--setenv", key, value]
        return args + ["--", self.python, "-I", "-c", _BOOTSTRAP_SOURCE]

    def spawn(self) -> Worker:
        uid = _fresh_uid() if self.as_root else None
        scratch = self._make_scratch(uid)
        # 0755, not 0700: bwrap execs as root without CAP_DAC_OVERRIDE, and must traverse /tmp when
        # the Python install lives under it. Only the sandbox uid can write there.
        (scratch / ".tmp").mkdir()
        os.chmod(scratch / ".tmp", 0o755)  # explicit: a strict umask would otherwise make it 0700
        if uid is not None:
            os.chown(scratch / ".tmp", uid, uid)
        # bwrap's own processes get a minimal environment too: its PID-1 reaper keeps the environ it
        # was started with, and that must not be the caller's.
        proc = self._popen(self.argv(scratch), env={"PATH": "/usr/bin:/bin"})
        return Worker(proc, scratch, SANDBOX_SCRATCH, uid, self.name)


class SubprocessBackend(_BackendBase):
    """A plain child process with rlimits, a scrubbed environment and a temp working dir.

    NOT a security boundary, and never chosen by default: the code runs as the caller's user with
    the caller's view of the filesystem, network and other processes. It stops accidents (runaway
    loops, memory, output, sleeping) only. ``agentgym.sandbox.audit.audit_backend`` lists what it
    does not stop; as root, ``RLIMIT_NPROC`` does not apply, so it does not bound fork bombs either.
    """

    name = "subprocess"
    secure = False

    def spawn(self) -> Worker:
        scratch = self._make_scratch(None)
        proc = self._popen([self.python, "-I", "-c", _BOOTSTRAP_SOURCE], env=_scrubbed_env(str(scratch)),
                           cwd=str(scratch))
        return Worker(proc, scratch, str(scratch), None, self.name)


class DockerBackend(_BackendBase):
    """One ``docker run`` per worker: ``--network none``, ``--memory``, ``--pids-limit``, ``--read-only``.

    Untested in this repository's CI (no Docker engine there): ``available()`` is False unless
    ``docker info`` answers. Limits given to ``spawn`` become the container's cgroup limits (the one
    backend with a hard *total* memory cap); per-request rlimits apply inside as on the others.
    The image must contain ``python3`` (default ``python:3.11-slim``).
    """

    name = "docker"
    secure = True

    def __init__(self, *, image: str = "python:3.11-slim", docker: str = "docker",
                 cgroup_limits: Limits | None = None,
                 scratch_root: str | os.PathLike[str] | None = None) -> None:
        super().__init__(python="python3", scratch_root=scratch_root)
        self.image = image
        self.docker = docker
        self.cgroup_limits = cgroup_limits or Limits()

    @classmethod
    def available(cls, docker: str = "docker") -> bool:
        """Whether a Docker engine answers ``docker info`` (within 5 s)."""
        if shutil.which(docker) is None:
            return False
        try:
            return subprocess.run([docker, "info"], capture_output=True, timeout=5, check=False).returncode == 0
        except (OSError, subprocess.SubprocessError):
            return False

    def spawn(self) -> Worker:
        scratch = self._make_scratch(65534)
        limits = self.cgroup_limits
        argv = [self.docker, "run", "--rm", "-i", "--network", "none", "--read-only",
                "--memory", f"{limits.memory_mb}m", "--pids-limit", str(limits.max_processes),
                "--cap-drop", "ALL", "--cap-add", "SETUID", "--cap-add", "SETGID",
                "--security-opt", "no-new-privileges", "--tmpfs", "/tmp:size=64m",
                "-v", f"{scratch}:{SANDBOX_SCRATCH}:rw", "-w", SANDBOX_SCRATCH]
        for key, value in _scrubbed_env(SANDBOX_SCRATCH).items():
            argv += ["-e", f"{key}={value}"]
        argv += [self.image, self.python, "-I", "-c", _BOOTSTRAP_SOURCE]
        proc = self._popen(argv, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        return Worker(proc, scratch, SANDBOX_SCRATCH, 65534, self.name)


def _python_prefixes(python: str) -> list[str]:
    """Directories the interpreter needs: its venv prefix and base prefix (resolved)."""
    if python == sys.executable:
        candidates = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    else:
        probe = subprocess.run([python, "-I", "-c", "import sys; print(sys.prefix); print(sys.base_prefix)"],
                               capture_output=True, text=True, timeout=10, check=True)
        candidates = set(probe.stdout.split())
    resolved = {str(Path(path).resolve()) for path in candidates}
    candidates |= resolved
    return sorted(path for path in candidates if path not in ("/", "/usr"))


@functools.lru_cache(maxsize=1)
def _probe_bwrap() -> tuple[bool, str]:
    if shutil.which("bwrap") is None:
        return False, "bwrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    try:
        result = BwrapBackend().run("print('ok')", limits=Limits(wall_clock_s=10))
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"bwrap could not start: {exc}"
    if result.stdout.strip() != "ok":
        return False, f"bwrap probe failed (exit {result.exit_code}): {result.stderr.strip()[:500]}"
    return True, ""


BackendName = Literal["auto", "bwrap", "docker", "subprocess"]


def default_backend(name: BackendName = "auto", **kwargs: object) -> Backend:
    """The backend called ``name``; ``"auto"`` picks bwrap, else docker, and never ``subprocess``.

    Raises:
        ConfigError: the backend is unknown or cannot run here (the message says why).
    """
    if name in ("auto", "bwrap") and BwrapBackend.available():
        return BwrapBackend(**kwargs)  # type: ignore[arg-type]
    if name == "bwrap":
        raise ConfigError(f"the bwrap sandbox backend cannot run here: {BwrapBackend.unavailable_reason()}")
    if name in ("auto", "docker") and DockerBackend.available():
        return DockerBackend(**kwargs)  # type: ignore[arg-type]
    if name == "docker":
        raise ConfigError("the docker sandbox backend needs a Docker engine, and `docker info` did not answer")
    if name == "subprocess":
        return SubprocessBackend(**kwargs)  # type: ignore[arg-type]
    if name == "auto":
        raise ConfigError("no secure sandbox backend here: install bubblewrap (apt-get install bubblewrap) or "
                          f"Docker ({BwrapBackend.unavailable_reason()}); backend='subprocess' is the "
                          "opt-in, NOT secure fallback")
    raise ConfigError(f"unknown sandbox backend {name!r}; choose one of auto, bwrap, docker, subprocess")


def run_code(code: str, *, stdin: str | bytes = "", limits: Limits | None = None,
             backend: Backend | BackendName = "auto") -> Result:
    """Run untrusted Python ``code`` in a sandbox and return what it printed and how it ended.

    Args:
        code: Python source, run as ``__main__`` in a fresh interpreter.
        stdin: the program's standard input.
        limits: resource limits (default ``Limits()``).
        backend: a backend object or name (``"auto"``: bwrap, else docker; never subprocess).

    Returns:
        A ``Result``. Limits hit are reported in it, not raised.

    Raises:
        ConfigError: no usable backend (see ``default_backend``).
    """
    chosen = default_backend(backend) if isinstance(backend, str) else backend
    return chosen.run(code, stdin, limits or Limits())


__all__ = [
    "Backend", "BwrapBackend", "DockerBackend", "Limits", "Result", "SubprocessBackend", "Worker",
    "default_backend", "encode_request", "run_code",
]
