"""Sandbox backends that run untrusted Python outside the caller's process: ``BwrapBackend``,
``SubprocessBackend``, ``DockerBackend``, ``default_backend`` and ``run_code`` (``Limits`` and
``Result`` live in ``agentgym.sandbox.limits``, the run itself in ``agentgym.sandbox.worker``).

Every backend starts a *worker*: a sandboxed interpreter running ``bootstrap.py`` that waits on
stdin for one request (code + stdin + limits), applies the limits, and runs the code. Limits are
applied inside the worker after the request arrives, so the same worker can be spawned ahead of
time (``agentgym.sandbox.pool.WarmPool``). A worker serves one request and is then discarded.

What bounds what, on the ``bwrap`` backend (measured in ``tests/sandbox/test_sandbox_escape.py``):

- wall clock: the host kills bwrap's process group when ``wall_clock_s`` runs out; bwrap's
  ``--die-with-parent`` and the PID namespace then take every process of the sandbox with it.
- CPU / memory / files / open files of one process: rlimits (``RLIMIT_CPU``, ``RLIMIT_AS``,
  ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE``).
- memory of the run as a whole (``memory_mb``, all processes together): a memory cgroup of the
  run where one is delegated to this process (``memory_guard="cgroup"``; the kernel's OOM killer
  acts, the run is then killed), else a supervisor that sums the process tree's resident memory
  every 50 ms and kills the run past it (``memory_guard="supervisor"``; a poll, so a fast
  allocator can overshoot by what it allocates in 50 ms). ``/health`` and each ``Result`` say which.
- disk (``disk_mb``): the scratch dir is a tmpfs of that size (``ENOSPC`` past it), counted in the
  run's memory cgroup; the root, ``/dev`` and every bound host dir are read-only.
- namespaces, mounts and kernel surfaces: a seccomp filter (``agentgym.sandbox.seccomp``) denies
  ``unshare``, ``setns``, ``clone`` with ``CLONE_NEW*``, ``mount``, ``memfd_create``, System V
  shared memory and the rest of ``DENIED_SYSCALLS``.
- processes (fork bombs): ``RLIMIT_NPROC`` counts the processes of a *kernel* uid, and the kernel
  exempts uid 0 entirely — also inside a user namespace mapped to root, which is what bwrap makes
  when run by root. So when the host runs as root, bwrap runs in its privileged mode (no user
  namespace) and the worker drops to a fresh, random, otherwise unused uid before the code runs:
  ``RLIMIT_NPROC`` then bounds that sandbox alone. Run by a non-root user, bwrap makes a user
  namespace and the per-namespace process count (Linux >= 5.14) does the same job.
- what the code can read of the host: no host dir but ``/usr`` and the Python install; bwrap's
  arguments reach it through a file descriptor (``--args``), so the sandbox's PID 1 command line
  names no host path; the bootstrap program arrives on stdin behind a short loader (``LOADER``), so
  that command line holds no framework source either; the hostname is ``sandbox``.
"""

from __future__ import annotations

import functools
import os
import platform
import pwd
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Literal, Protocol

from agentgym.errors import ConfigError
from agentgym.sandbox.cgroup import CgroupParent, RunCgroup, memory_cgroup_parent
from agentgym.sandbox.limits import KilledReason, Limits, MemoryGuardName, Result
from agentgym.sandbox.seccomp import build_filter
from agentgym.sandbox.worker import Worker, encode_request, make_scratch_dir

#: Inside the sandbox the scratch dir is mounted here (bwrap, docker).
SANDBOX_SCRATCH = "/scratch"
#: The sandbox's hostname (bwrap): nothing of the host's name gets in.
SANDBOX_HOSTNAME = "sandbox"
_BOOTSTRAP_SOURCE = (Path(__file__).with_name("bootstrap.py")).read_text(encoding="utf-8").encode("utf-8")
#: What a worker reads first on stdin: the bootstrap's length (8 decimal digits), then its source.
BOOTSTRAP_FRAME = b"%08d" % len(_BOOTSTRAP_SOURCE) + _BOOTSTRAP_SOURCE
#: The worker's whole program on its command line, which sandboxed code can read (``/proc/1/cmdline``
#: under bwrap, ``ps`` elsewhere): a loader that runs the bootstrap it reads from stdin, so the command
#: line shows neither the framework's source nor its module layout.
LOADER = ("import os\n"
          "def read(count):\n"
          "    data = b''\n"
          "    while len(data) < count:\n"
          "        chunk = os.read(0, count - len(data))\n"
          "        if not chunk:\n"
          "            os._exit(70)\n"
          "        data += chunk\n"
          "    return data\n"
          "exec(compile(read(int(read(8))), '<sandbox>', 'exec'))\n")
#: Fresh uids for sandboxes run by root: far above any real account, never two live at once.
_UID_RANGE = (1_500_000, 1_999_999)

MemoryGuardChoice = Literal["auto", "cgroup", "supervisor"]


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


class Backend(Protocol):
    """A way to start sandboxed workers.

    Contract: ``spawn(limits)`` returns a ``Worker`` whose process runs ``bootstrap.py`` and waits
    for one request; it must not run anything of the caller's before that. ``limits`` fixes what
    must be set before the worker starts (the size of its scratch space); the rest is applied per
    request. ``secure`` says whether the backend is meant as a security boundary (only those may
    run untrusted code by default); ``memory_guard`` what bounds a run's total memory.
    """

    name: str
    secure: bool
    memory_guard: MemoryGuardName

    def spawn(self, limits: Limits | None = None) -> Worker: ...

    def run(self, code: str, stdin: str | bytes = "", limits: Limits | None = None) -> Result: ...


def resolve_memory_guard(choice: MemoryGuardChoice) -> tuple[MemoryGuardName, CgroupParent | None, str]:
    """``(guard, cgroup parent, why)`` for a backend's ``memory_guard`` argument.

    ``"auto"`` takes a memory cgroup when one is delegated to this process, else the supervisor.

    Raises:
        ConfigError: ``"cgroup"`` was asked for and none is available (the message says why), or
            the choice is unknown.
    """
    if choice not in ("auto", "cgroup", "supervisor"):
        raise ConfigError(f"unknown memory_guard {choice!r}; choose auto, cgroup or supervisor")
    if choice == "supervisor":
        return "supervisor", None, "chosen: the supervisor sums the run's resident memory every 50 ms"
    parent, reason = memory_cgroup_parent()
    if parent is not None:
        return "cgroup", parent, f"a memory cgroup per run under {parent.path} (cgroup v{parent.version})"
    if choice == "cgroup":
        raise ConfigError(f"memory_guard='cgroup' needs a memory cgroup this process may create: {reason}")
    return "supervisor", None, f"no memory cgroup available ({reason}); the supervisor sums resident memory"


class _BackendBase:
    name = "base"
    secure = False

    def __init__(self, *, python: str | None = None, scratch_root: str | os.PathLike[str] | None = None,
                 memory_guard: MemoryGuardChoice = "auto") -> None:
        self.python = python or sys.executable
        self.scratch_root = Path(scratch_root) if scratch_root is not None else None
        guard, self._cgroup_parent, self.memory_guard_detail = resolve_memory_guard(memory_guard)
        self.memory_guard: MemoryGuardName = guard

    def _new_cgroup(self) -> RunCgroup | None:
        return RunCgroup(self._cgroup_parent) if self._cgroup_parent is not None else None

    def spawn(self, limits: Limits | None = None) -> Worker:
        raise NotImplementedError

    def run(self, code: str, stdin: str | bytes = "", limits: Limits | None = None) -> Result:
        """Run ``code`` in a freshly spawned worker (see ``run_code``)."""
        limits = limits or Limits()
        return self.spawn(limits).execute(code, stdin, limits)

    def _popen(self, argv: list[str], env: dict[str, str], cwd: str | None = None,
               cgroup: RunCgroup | None = None, pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[bytes]:
        if cgroup is not None:
            argv = cgroup.wrap(argv)
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env=env, cwd=cwd, start_new_session=True,
                                    close_fds=True, pass_fds=pass_fds)
        except BaseException:
            if cgroup is not None:
                cgroup.remove()
            raise
        # The bootstrap goes ahead of the request; a few KiB, so the pipe's buffer takes it at once.
        try:
            proc.stdin.write(BOOTSTRAP_FRAME)  # type: ignore[union-attr]
            proc.stdin.flush()  # type: ignore[union-attr]
        except OSError:
            pass  # the worker died at start-up: its run reports the exit
        return proc


def _fd_with(data: bytes) -> int:
    """A file descriptor to read ``data`` from (an unlinked in-memory file), positioned at the start."""
    fd = os.memfd_create("agentgym-bwrap")  # Linux, as bwrap itself
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class BwrapBackend(_BackendBase):
    """bubblewrap: new mount, PID, network, IPC, UTS and cgroup namespaces; the security boundary.

    Inside: read-only ``/usr`` (and the ``/lib*``, ``/bin`` links), the Python install read-only
    (``sys.prefix`` and ``sys.base_prefix``), fresh ``/proc`` and a read-only ``/dev``, and the
    scratch space at ``/scratch`` (also ``$HOME``, ``$TMPDIR`` and ``/tmp``): a tmpfs of
    ``Limits.disk_mb``. Nothing else: no ``/etc``, no project dir, no host ``/tmp``. No network but
    the namespace's own loopback. The environment is ``--clearenv`` plus ``_scrubbed_env``. As root,
    the code runs as a fresh unprivileged uid with no capabilities (see the module doc for why). A
    seccomp filter denies namespaces, mounts and the other ``agentgym.sandbox.seccomp.DENIED_SYSCALLS``.

    Args:
        bwrap: the bwrap executable.
        python: the interpreter to run (default: this one).
        scratch_root: unused (the scratch is a tmpfs); kept so every backend takes the same arguments.
        memory_guard: ``"auto"`` (a memory cgroup where available, else the supervisor), ``"cgroup"``
            or ``"supervisor"``.
        seccomp: install the seccomp filter (default). ``False`` only for a machine the filter has
            no syscall table for, knowing that nested namespaces are then allowed.
    """

    name = "bwrap"
    secure = True

    def __init__(self, *, bwrap: str = "bwrap", python: str | None = None,
                 scratch_root: str | os.PathLike[str] | None = None, memory_guard: MemoryGuardChoice = "auto",
                 seccomp: bool = True) -> None:
        super().__init__(python=python, scratch_root=scratch_root, memory_guard=memory_guard)
        self.bwrap = shutil.which(bwrap) or bwrap
        self.as_root = os.geteuid() == 0
        self.seccomp = seccomp
        self._filter = build_filter(platform.machine()) if seccomp else None

    @classmethod
    def available(cls) -> bool:
        """Whether bwrap is installed *and* a probe sandbox really runs here (cached)."""
        return _probe_bwrap()[0]

    @classmethod
    def unavailable_reason(cls) -> str:
        """Why ``available()`` is False (the probe's error), or ``""``."""
        return _probe_bwrap()[1]

    def argv(self, disk_mb: int, seccomp_fd: int | None = None) -> list[str]:
        """bwrap's options for a worker with a ``disk_mb`` scratch tmpfs (the command is ``command()``)."""
        args = ["--die-with-parent", "--new-session"]
        if self.as_root:
            # Privileged mode without a user namespace, so the code can run as a real unprivileged
            # uid (RLIMIT_NPROC exempts kernel uid 0). Only setuid/setgid survive, for that drop.
            args += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup",
                     "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        else:
            args += ["--unshare-all", "--unshare-user"]
        args += ["--hostname", SANDBOX_HOSTNAME, "--ro-bind", "/usr", "/usr"]
        for link in ("lib", "lib64", "bin", "sbin"):
            path = Path("/") / link
            if path.is_symlink():
                args += ["--symlink", os.readlink(path), str(path)]
            elif path.is_dir():
                args += ["--ro-bind", str(path), str(path)]
        # The scratch: a tmpfs of the run's disk size, world-writable as the sandbox uid is not yet
        # known to bwrap (it is the only user inside).
        prefixes = [prefix for prefix in _python_prefixes(self.python) if not prefix.startswith("/usr/")]
        # /tmp is the scratch too. When the Python install lives under /tmp (a checkout with its venv
        # there), the scratch tmpfs is mounted at /tmp itself, the install is bound read-only inside
        # it, and /scratch points there; otherwise the tmpfs is /scratch and /tmp points to it.
        under_tmp = any(prefix.startswith("/tmp/") for prefix in prefixes)
        args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777",
                 "--size", str(int(disk_mb) * 1024 * 1024),
                 "--tmpfs", "/tmp" if under_tmp else SANDBOX_SCRATCH]
        args += (["--symlink", "/tmp", SANDBOX_SCRATCH] if under_tmp
                 else ["--symlink", SANDBOX_SCRATCH, "/tmp"])
        made: set[str] = {"/tmp"} if under_tmp else set()
        for prefix in prefixes:
            # Parents bwrap would create with the host's umask (e.g. /root as 0700, which the
            # sandbox uid could not traverse): create them world-traversable first.
            for parent in reversed(Path(prefix).parents):
                if str(parent) != "/" and str(parent) not in made:
                    made.add(str(parent))
                    args += ["--perms", "0755", "--dir", str(parent)]
            args += ["--ro-bind", prefix, prefix]
        # Last: the root and /dev (tmpfs both, unbounded host memory) read-only; /scratch stays writable.
        args += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/", "--clearenv"]
        for key, value in _scrubbed_env(SANDBOX_SCRATCH).items():
            args += ["--setenv", key, value]
        if seccomp_fd is not None:
            args += ["--seccomp", str(seccomp_fd)]
        return args

    def command(self) -> list[str]:
        """The worker's command inside the sandbox (after bwrap's options)."""
        return ["--", self.python, "-I", "-c", LOADER]

    def spawn(self, limits: Limits | None = None) -> Worker:
        disk_mb = int((limits or Limits()).disk_mb)
        uid = _fresh_uid() if self.as_root else None
        fds: list[int] = []
        try:
            seccomp_fd = None
            if self._filter is not None:
                seccomp_fd = _fd_with(self._filter)
                fds.append(seccomp_fd)
            # The options go through a descriptor: bwrap's command line, which the sandbox's PID 1
            # keeps and the code can read in /proc/1/cmdline, then names no host path but the
            # interpreter's (which the sandbox sees anyway: it runs it). bwrap reads the command
            # itself only from its real command line.
            args_fd = _fd_with(b"\0".join(arg.encode() for arg in self.argv(disk_mb, seccomp_fd)) + b"\0")
            fds.append(args_fd)
            cgroup = self._new_cgroup()
            # bwrap's own processes get a minimal environment too: its PID-1 reaper keeps the
            # environ it was started with, and that must not be the caller's.
            proc = self._popen([self.bwrap, "--args", str(args_fd), *self.command()],
                               env={"PATH": "/usr/bin:/bin"}, cgroup=cgroup, pass_fds=tuple(fds))
        finally:
            for fd in fds:
                os.close(fd)
        return Worker(proc, None, SANDBOX_SCRATCH, uid, self.name, memory_guard=self.memory_guard,
                      cgroup=cgroup, disk_mb=disk_mb)


class SubprocessBackend(_BackendBase):
    """A plain child process with rlimits, a scrubbed environment and a temp working dir.

    NOT a security boundary, and never chosen by default: the code runs as the caller's user with
    the caller's view of the filesystem, network and other processes. It stops accidents (runaway
    loops, memory, output, sleeping) only. ``agentgym.sandbox.audit.audit_backend`` lists what it
    does not stop; as root, ``RLIMIT_NPROC`` does not apply, so it does not bound fork bombs either,
    and nothing bounds its disk use. When the run ends, its process group, its cgroup (where there
    is one) and every process the supervisor saw in its tree are killed.
    """

    name = "subprocess"
    secure = False

    def spawn(self, limits: Limits | None = None) -> Worker:
        scratch = make_scratch_dir(self.scratch_root, None)
        cgroup = self._new_cgroup()
        try:
            proc = self._popen([self.python, "-I", "-c", LOADER], env=_scrubbed_env(str(scratch)),
                               cwd=str(scratch), cgroup=cgroup)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        return Worker(proc, scratch, str(scratch), None, self.name, memory_guard=self.memory_guard,
                      cgroup=cgroup, disk_mb=None)


class DockerBackend(_BackendBase):
    """One ``docker run`` per worker: ``--network none``, ``--memory``, ``--pids-limit``, ``--read-only``.

    Untested in this repository's CI (no Docker engine there): ``available()`` is False unless
    ``docker info`` answers. Limits given to ``spawn`` become the container's cgroup limits (its
    ``--memory`` bounds the run's total memory, the scratch tmpfs included); per-request rlimits
    apply inside as on the others. The image must contain ``python3`` (default ``python:3.11-slim``).
    """

    name = "docker"
    secure = True

    def __init__(self, *, image: str = "python:3.11-slim", docker: str = "docker",
                 cgroup_limits: Limits | None = None,
                 scratch_root: str | os.PathLike[str] | None = None) -> None:
        super().__init__(python="python3", scratch_root=scratch_root, memory_guard="supervisor")
        self.memory_guard = "docker"
        self.memory_guard_detail = "the container's own memory cgroup (docker run --memory)"
        self.image = image
        self.docker = docker
        self.cgroup_limits = cgroup_limits or Limits()

    @classmethod
    def available(cls, docker: str = "docker") -> bool:
        """Whether a Docker engine answers ``docker info`` (within 5 s)."""
        if shutil.which(docker) is None:
            return False
        try:
            return subprocess.run([docker, "info"], capture_output=True, timeout=5,
                                  check=False).returncode == 0
        except (OSError, subprocess.SubprocessError):
            return False

    def spawn(self, limits: Limits | None = None) -> Worker:
        cap = self.cgroup_limits
        disk_mb = int((limits or cap).disk_mb)
        argv = [self.docker, "run", "--rm", "-i", "--network", "none", "--read-only",
                "--hostname", SANDBOX_HOSTNAME,
                "--memory", f"{cap.memory_mb + disk_mb}m", "--pids-limit", str(cap.max_processes),
                "--cap-drop", "ALL", "--cap-add", "SETUID", "--cap-add", "SETGID",
                "--security-opt", "no-new-privileges", "--tmpfs", f"/tmp:size={disk_mb}m,mode=1777",
                "--tmpfs", f"{SANDBOX_SCRATCH}:size={disk_mb}m,mode=1777", "-w", SANDBOX_SCRATCH]
        for key, value in _scrubbed_env(SANDBOX_SCRATCH).items():
            argv += ["-e", f"{key}={value}"]
        argv += [self.image, self.python, "-I", "-c", LOADER]
        proc = self._popen(argv, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        return Worker(proc, None, SANDBOX_SCRATCH, 65534, self.name, memory_guard="docker", disk_mb=disk_mb)


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
    except (OSError, subprocess.SubprocessError, ConfigError) as exc:
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
        raise ConfigError("the docker sandbox backend needs a Docker engine, "
                          "and `docker info` did not answer")
    if name == "subprocess":
        return SubprocessBackend(**kwargs)  # type: ignore[arg-type]
    if name == "auto":
        raise ConfigError("no secure sandbox backend here: install bubblewrap (apt-get install bubblewrap) "
                          f"or Docker ({BwrapBackend.unavailable_reason()}); backend='subprocess' is the "
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
    "Backend", "BwrapBackend", "DockerBackend", "KilledReason", "Limits", "Result", "SubprocessBackend",
    "Worker", "default_backend", "encode_request", "resolve_memory_guard", "run_code",
]
