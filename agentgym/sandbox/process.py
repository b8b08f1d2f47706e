"""The host's process table as the sandbox needs it: ``ProcessTree`` (a run's processes, their memory,
killing them) and ``owner_tag`` / ``owner_alive`` (names of things a service leaves on the host, so a
later start can tell its own live ones from a killed one's leftovers). Linux ``/proc`` only."""

from __future__ import annotations

import functools
import os
import signal
from pathlib import Path

_PROC = Path("/proc")
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` split after the command name (which may hold spaces and parentheses)."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or ``None`` if it is gone.

    With the pid, it names a process for good: a pid is reused, the pair is not.
    """
    parts = _stat_fields(pid)
    return int(parts[19]) if parts else None


@functools.lru_cache(maxsize=1)
def _own_tag(pid: int) -> str:
    return f"{pid}x{start_time(pid) or 0}"


def owner_tag() -> str:
    """``"<pid>x<start time>"`` of this process, for names of dirs it creates on the host.

    Example:
        >>> owner_alive(owner_tag())
        True
    """
    return _own_tag(os.getpid())


def owner_alive(tag: str) -> bool:
    """Whether the process an ``owner_tag`` names still runs (``False`` for a malformed tag)."""
    pid_text, _, start_text = tag.partition("x")
    if not (pid_text.isdigit() and start_text.isdigit()):
        return False
    started = start_time(int(pid_text))
    return started is not None and started == int(start_text)


class ProcessTree:
    """The processes descended from one root process, found by walking ``/proc`` by parent pid.

    ``scan`` also remembers every process it has seen (pid and start time), so ``kill_seen`` can
    kill the ones that left the tree since (a child whose parent exited is adopted by init).

    Example:
        >>> import subprocess, sys
        >>> child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        >>> tree = ProcessTree(child.pid)
        >>> pids, resident = tree.scan()
        >>> pids == [child.pid] and resident > 0
        True
        >>> tree.kill_seen(), child.wait()
        (1, -9)
    """

    def __init__(self, root_pid: int) -> None:
        self.root_pid = root_pid
        self.seen: dict[int, int] = {}
        """Every pid found in the tree so far, with its start time."""

    def scan(self) -> tuple[list[int], int]:
        """The tree's pids now, and the sum of their anonymous resident memory in bytes.

        Anonymous memory (``statm``'s resident minus shared) is what allocations take; file pages
        (the interpreter, shared libraries) are left out, as they are shared with the host.
        """
        children: dict[int, list[int]] = {}
        starts: dict[int, int] = {}
        for entry in os.scandir(_PROC):
            if not entry.name.isdigit():
                continue
            parts = _stat_fields(int(entry.name))
            if parts is None:
                continue
            pid = int(entry.name)
            children.setdefault(int(parts[1]), []).append(pid)
            starts[pid] = int(parts[19])
        found: list[int] = []
        stack = [self.root_pid] if self.root_pid in starts else []
        while stack:
            pid = stack.pop()
            found.append(pid)
            stack.extend(children.get(pid, ()))
        resident = 0
        for pid in found:
            self.seen.setdefault(pid, starts[pid])
            try:
                statm = (_PROC / str(pid) / "statm").read_text().split()
            except OSError:
                continue
            resident += max(int(statm[1]) - int(statm[2]), 0) * _PAGE
        return found, resident

    def kill_seen(self) -> int:
        """SIGKILL every process ``scan`` has seen that still runs (same pid and start time)."""
        killed = 0
        for pid, started in self.seen.items():
            if start_time(pid) == started:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
                except (ProcessLookupError, PermissionError):
                    pass
        return killed


__all__ = ["ProcessTree", "owner_alive", "owner_tag", "start_time"]
