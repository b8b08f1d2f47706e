"""Memory cgroups for sandbox runs: ``memory_cgroup_parent`` (is one delegated to us?), ``RunCgroup``
(one run's cgroup: limit, OOM count, kill, removal) and ``clean_stale_cgroups``.

A run's cgroup is made inside the cgroup this process is in, which works where that cgroup is
writable to us: cgroup v1's memory hierarchy (as in many containers), or cgroup v2 when the memory
controller is enabled for our cgroup's children. Where neither is, the sandbox falls back on the
supervisor in ``agentgym.sandbox.worker`` that sums the run's resident memory.
"""

from __future__ import annotations

import errno
import functools
import itertools
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from agentgym.sandbox.process import owner_alive, owner_tag

_PREFIX = "agentgym-run-"
_counter = itertools.count()


@dataclass(frozen=True)
class CgroupParent:
    """The cgroup directory runs' cgroups are created in, and its cgroup version (1 or 2)."""

    path: Path
    version: int


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """``(root, mount point, fs type, super options)`` of each cgroup mount in our mount namespace."""
    found = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
            found.append((fields[3], fields[4], tail[0], set(tail[2].split(","))))
    return found


def _candidates() -> list[CgroupParent]:
    """Our own cgroup in the v2 hierarchy, then in the v1 memory hierarchy, where mounted."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    own: dict[str, str] = {}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            own["cgroup2"] = path
        elif "memory" in controllers.split(","):
            own["memory"] = path
    parents = []
    for root, mount_point, fs_type, options in _mounts():
        key = "cgroup2" if fs_type == "cgroup2" else ("memory" if "memory" in options else None)
        path = own.get(key or "")
        if path is None or not (path == root or path.startswith(root.rstrip("/") + "/")):
            continue
        relative = path[len(root.rstrip("/")):].lstrip("/")
        parents.append(CgroupParent(Path(mount_point) / relative, 2 if fs_type == "cgroup2" else 1))
    return sorted(parents, key=lambda parent: -parent.version)


def _limit_file(version: int) -> str:
    return "memory.max" if version == 2 else "memory.limit_in_bytes"


@functools.lru_cache(maxsize=1)
def memory_cgroup_parent() -> tuple[CgroupParent | None, str]:
    """Where run cgroups can be made with a memory limit, or ``(None, why not)``. Probed once."""
    reasons = []
    for parent in _candidates():
        if parent.version == 2:
            # Only where the memory controller is already on for our cgroup's children: turning it
            # on is the host's call (and impossible in a cgroup that holds processes).
            try:
                control = (parent.path / "cgroup.subtree_control").read_text().split()
            except OSError:
                control = []
            if "memory" not in control:
                reasons.append(f"cgroup v2 {parent.path}: the memory controller is not enabled for its "
                               "children")
                continue
        probe = parent.path / f"{_PREFIX}probe-{owner_tag()}"
        try:
            probe.mkdir(exist_ok=True)
            try:
                (probe / _limit_file(parent.version)).write_text(str(64 * 1024 * 1024))
            finally:
                probe.rmdir()
        except OSError as exc:
            reasons.append(f"cgroup v{parent.version} {parent.path}: {exc.strerror or exc}")
            continue
        return parent, ""
    return None, "; ".join(reasons) or "no memory cgroup hierarchy is mounted here"


class RunCgroup:
    """One run's memory cgroup. Processes enter it through ``wrap`` (before they can fork)."""

    def __init__(self, parent: CgroupParent) -> None:
        self.version = parent.version
        self.path = parent.path / f"{_PREFIX}{owner_tag()}-{next(_counter)}"
        self.path.mkdir()

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run by a shell that first moves itself into this cgroup, then execs ``argv``.

        Joining in the child before ``exec`` (rather than moving the pid from here after it started)
        leaves no moment in which the program, or anything it forks, is outside the cgroup.
        """
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.path / "cgroup.procs"), *argv]

    def limit(self, limit_bytes: int) -> None:
        """Cap the cgroup's memory (and memory + swap, where swap is accounted) at ``limit_bytes``."""
        if self.version == 2:
            (self.path / "memory.max").write_text(str(limit_bytes))
            swap = self.path / "memory.swap.max"
            if swap.exists():
                swap.write_text("0")
            return
        (self.path / "memory.limit_in_bytes").write_text(str(limit_bytes))
        swap = self.path / "memory.memsw.limit_in_bytes"
        if swap.exists():
            try:
                swap.write_text(str(limit_bytes))
            except OSError:  # swap accounting off in this kernel: nothing to bound
                pass

    def oom_kills(self) -> int:
        """How many processes the kernel killed for going over the limit."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            for line in (self.path / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def pids(self) -> list[int]:
        try:
            return [int(pid) for pid in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def kill(self) -> None:
        """SIGKILL every process in the cgroup, including ones forked while this runs."""
        kill_file = self.path / "cgroup.kill"
        if self.version == 2 and kill_file.exists():
            try:
                kill_file.write_text("1")
                return
            except OSError:
                pass
        for _ in range(100):  # each round kills what the previous one's survivors forked
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.002)

    def remove(self, wait_s: float = 2.0) -> bool:
        """Kill what is left and delete the cgroup; ``False`` if it could not be deleted in ``wait_s``."""
        deadline = time.monotonic() + wait_s
        while True:
            self.kill()
            try:
                self.path.rmdir()
                return True
            except FileNotFoundError:
                return True
            except OSError as exc:  # EBUSY while killed processes are being torn down
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    return False
            time.sleep(0.01)


def clean_stale_cgroups(parent: CgroupParent | None = None) -> int:
    """Delete run cgroups left by sandbox processes that no longer run (e.g. killed with ``kill -9``).

    Returns:
        How many were removed.
    """
    if parent is None:
        parent = memory_cgroup_parent()[0]
    if parent is None:
        return 0
    removed = 0
    try:
        entries = list(parent.path.iterdir())
    except OSError:
        return 0
    for entry in entries:
        name = entry.name
        if not name.startswith(_PREFIX) or not entry.is_dir():
            continue
        rest = name[len(_PREFIX):]
        tag = rest[len("probe-"):] if rest.startswith("probe-") else rest.rsplit("-", 1)[0]
        if owner_alive(tag):
            continue
        stale = RunCgroup.__new__(RunCgroup)
        stale.version, stale.path = parent.version, entry
        removed += stale.remove(wait_s=0.5)
    return removed


__all__ = ["CgroupParent", "RunCgroup", "clean_stale_cgroups", "memory_cgroup_parent"]
