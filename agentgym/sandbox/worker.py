"""One sandboxed worker and its run: ``Worker`` (send the request, supervise the run under the wall
clock, output cap and memory guard, then kill everything the run left), ``encode_request`` and
``clean_stale_scratch`` (scratch dirs of a killed service)."""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from agentgym.sandbox.cgroup import RunCgroup
from agentgym.sandbox.limits import KilledReason, Limits, Result
from agentgym.sandbox.process import ProcessTree, owner_alive, owner_tag

_READ_CHUNK = 65536
#: After the program exits, how long to wait for pipes held open by its leftover children.
_EXIT_GRACE_S = 0.2
#: How often the memory guard looks at the run (a cgroup's OOM count, or the process tree's memory).
_GUARD_INTERVAL_S = 0.05
#: Memory of the sandbox's own processes (bwrap's two, a shell) on top of the program's budget.
GUARD_SLACK_MB = 16
SCRATCH_PREFIX = "agentgym-sandbox-"


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


def make_scratch_dir(root: Path | None, uid: int | None) -> Path:
    """A fresh host scratch dir named after this process (so ``clean_stale_scratch`` can tell)."""
    scratch = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{owner_tag()}-", dir=root))
    os.chmod(scratch, 0o700)
    if uid is not None:
        os.chown(scratch, uid, uid)
    return scratch


def clean_stale_scratch(root: str | os.PathLike[str] | None = None) -> int:
    """Delete scratch dirs whose owning process no longer runs (a service killed with ``kill -9``).

    Args:
        root: where the scratch dirs are (default: the system temp dir).

    Returns:
        How many dirs were removed.
    """
    folder = Path(root) if root is not None else Path(tempfile.gettempdir())
    removed = 0
    try:
        entries = list(folder.iterdir())
    except OSError:
        return 0
    for entry in entries:
        if not entry.name.startswith(SCRATCH_PREFIX):
            continue
        tag = entry.name[len(SCRATCH_PREFIX):].split("-", 1)[0]
        if "x" in tag and not owner_alive(tag) and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
            removed += not entry.exists()
    return removed


class Worker:
    """One spawned sandboxed interpreter waiting for its single request.

    Args:
        proc: the worker's process, leader of its own process group.
        scratch_host: the host dir to delete afterwards (``None`` when the scratch is a tmpfs).
        scratch_inside: the scratch dir as the worker sees it.
        uid: the uid the code runs as (``None``: the worker's own).
        backend: the backend's name, for the result.
        memory_guard: ``"cgroup"``, ``"supervisor"`` or ``"docker"`` (see ``Result.memory_guard``).
        cgroup: the run's memory cgroup, which ``proc`` already runs in (``memory_guard="cgroup"``).
        disk_mb: size of the scratch space, or ``None`` where nothing bounds it.
    """

    def __init__(self, proc: subprocess.Popen[bytes], scratch_host: Path | None, scratch_inside: str,
                 uid: int | None, backend: str, *, memory_guard: str = "supervisor",
                 cgroup: RunCgroup | None = None, disk_mb: int | None = None) -> None:
        self.proc = proc
        self.scratch_host = scratch_host
        self.scratch_inside = scratch_inside
        self.uid = uid
        self.backend = backend
        self.memory_guard = memory_guard
        self.cgroup = cgroup
        self.disk_mb = disk_mb
        self.tree = ProcessTree(proc.pid)
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
            budget = (int(limits.memory_mb) + GUARD_SLACK_MB) * 1024 * 1024
            if self.cgroup is not None:
                self.cgroup.limit(budget + (self.disk_mb or 0) * 1024 * 1024)  # tmpfs pages are charged too
            frame = encode_request(code, stdin, limits, scratch=self.scratch_inside, uid=self.uid)
            result = self._supervise(frame, limits, budget)
            return Result(**{**result.to_dict(), "memory_guard": self.memory_guard, "disk_mb": self.disk_mb})
        finally:
            self.discard()

    def over_memory(self, budget: int) -> bool:
        """Whether the run went past its memory budget (the cgroup's OOM killer acted, or the tree's sum)."""
        if self.memory_guard == "cgroup" and self.cgroup is not None:
            return self.cgroup.oom_kills() > 0
        if self.memory_guard == "supervisor":
            return self.tree.scan()[1] > budget
        return False

    def kill(self) -> None:
        """Kill the worker's process group (bwrap's PID namespace goes with it), and its cgroup."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.cgroup is not None:
            self.cgroup.kill()

    def discard(self) -> None:
        """Kill whatever is left of the run, reap, and delete the scratch dir and the cgroup.

        Changed in v0.1: the process group is killed even when its leader has exited, and so is
        every process the supervisor saw, because a finished program's forked children lived on.
        """
        self._done = True
        self.kill()  # always: children of a finished leader still hold the group
        self.tree.kill_seen()
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
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.scratch_host is not None:
            shutil.rmtree(self.scratch_host, ignore_errors=True)

    def _supervise(self, frame: bytes, limits: Limits, budget: int) -> Result:
        """Feed ``frame`` to the worker and collect its output under the limits watched from outside."""
        proc = self.proc
        start = time.monotonic()
        deadline = start + limits.wall_clock_s
        cap = int(limits.output_bytes)
        out = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}  # type: ignore[union-attr]
        total = 0
        truncated = False
        killed: KilledReason | None = None
        pending: memoryview | None = memoryview(frame)
        selector = selectors.DefaultSelector()
        stdin_fd = proc.stdin.fileno()  # type: ignore[union-attr]
        os.set_blocking(stdin_fd, False)
        selector.register(stdin_fd, selectors.EVENT_WRITE)
        for fd in out:
            selector.register(fd, selectors.EVENT_READ)
        open_reads = set(out)
        exited_at: float | None = None
        next_guard = start
        try:
            while open_reads or pending is not None:
                now = time.monotonic()
                if now >= deadline:
                    killed = "wall_clock"
                    break
                if now >= next_guard:
                    next_guard = now + _GUARD_INTERVAL_S
                    if self.over_memory(budget):
                        killed = "memory"
                        break
                if exited_at is None and proc.poll() is not None:
                    exited_at = now
                if exited_at is not None and now - exited_at > _EXIT_GRACE_S:
                    break  # the program is done; whatever still holds its pipes is killed below
                for key, _ in selector.select(timeout=min(deadline - now, _GUARD_INTERVAL_S)):
                    fd = key.fd
                    if fd == stdin_fd:
                        try:
                            written = os.write(fd, pending)  # type: ignore[arg-type]
                            pending = pending[written:]  # type: ignore[index]
                        except OSError:  # the worker is gone (BrokenPipeError) or refused the rest
                            pending = memoryview(b"")
                        if not pending:
                            pending = None
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
            self.kill()
        try:
            returncode = proc.wait(timeout=max(deadline - time.monotonic(), 0) + 1)
        except subprocess.TimeoutExpired:
            self.kill()
            returncode = proc.wait(timeout=5)
        if killed is None and self.over_memory(budget):  # the kernel's OOM killer ended the program
            killed = "memory"
        return _result(out, returncode, killed, truncated, time.monotonic() - start, limits, self.backend)


def _result(out: dict[int, bytearray], returncode: int, killed: KilledReason | None, truncated: bool,
            wall_s: float, limits: Limits, backend: str) -> Result:
    exit_code: int | None = returncode
    if killed is not None:
        exit_code = None
    else:
        # bwrap reports a signal death of the program as 128 + N; a plain child as -N.
        signum = (-returncode if returncode < 0
                  else returncode - 128 if backend == "bwrap" and returncode > 128 else 0)
        if signum > 0:
            exit_code = -signum
            killed = "cpu" if signum == signal.SIGXCPU or (
                signum == signal.SIGKILL and wall_s >= limits.cpu_limit_s) else "signal"
    stdout, stderr = (bytes(buffer).decode("utf-8", "replace") for buffer in out.values())
    return Result(stdout=stdout, stderr=stderr, exit_code=exit_code, timed_out=killed == "wall_clock",
                  killed_reason=killed, wall_s=round(wall_s, 4), truncated=truncated, backend=backend)


__all__ = ["GUARD_SLACK_MB", "Worker", "clean_stale_scratch", "encode_request", "make_scratch_dir"]
