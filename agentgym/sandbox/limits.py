"""What a sandbox run may use and what it produced: ``Limits`` and ``Result``."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

from agentgym.errors import ConfigError

KilledReason = Literal["wall_clock", "output_limit", "cpu", "memory", "signal"]
#: How the run's total memory is bounded: a memory cgroup (kernel-enforced), a supervisor that sums
#: the process tree's resident memory and kills the run, or a Docker container's own cgroup.
MemoryGuardName = Literal["cgroup", "supervisor", "docker"]


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

    Changed in v0.1: ``memory_mb`` bounds the run as a whole too, not only each process, and
    ``disk_mb`` bounds the scratch space, because per-process rlimits let a run of many processes
    (or many files) take far more than its limit.
    """

    wall_clock_s: float = 5.0
    """Wall-clock budget of the run, enforced from outside: the whole sandbox is killed at the end."""
    cpu_s: int | None = None
    """CPU seconds per process (``RLIMIT_CPU``); ``None``: ``ceil(wall_clock_s) + 1``."""
    memory_mb: int = 512
    """Memory in MiB: the address space of each process (``RLIMIT_AS``; a bigger allocation raises
    ``MemoryError``) and the resident memory of the whole run (all its processes together; past it
    the run is killed with ``killed_reason="memory"``)."""
    max_processes: int = 32
    """Processes and threads of the sandbox (``RLIMIT_NPROC`` of its own uid; see ``backends``)."""
    output_bytes: int = 64 * 1024
    """Cap on stdout + stderr together; past it the output is truncated, flagged, and the run killed."""
    file_size_mb: int = 16
    """Largest file the code may write (``RLIMIT_FSIZE``)."""
    open_files: int = 64
    """Open file descriptors per process (``RLIMIT_NOFILE``)."""
    disk_mb: int = 64
    """Size of the run's scratch space (its working dir, ``$HOME``, ``$TMPDIR``) in MiB, all files
    together: a size-limited tmpfs on bwrap and docker, where a full disk is ``ENOSPC``. Being
    memory, it is counted in the run's memory cgroup on top of ``memory_mb``."""

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
    """What one run produced.

    Changed in v0.1: ``memory_guard`` and ``disk_mb`` say how the run's total memory and its scratch
    space were bounded; ``killed_reason`` may be ``"memory"``.
    """

    stdout: str
    """Standard output (UTF-8, undecodable bytes replaced), at most ``Limits.output_bytes`` with stderr."""
    stderr: str
    """Standard error, same rules."""
    exit_code: int | None
    """The program's exit status; ``-N`` when signal N ended it; ``None`` when the host killed it."""
    timed_out: bool
    """The wall clock ran out and the sandbox was killed."""
    killed_reason: KilledReason | None
    """Why the run was cut short: ``wall_clock``, ``output_limit``, ``cpu`` (``RLIMIT_CPU``),
    ``memory`` (the run's processes together went past ``memory_mb``), ``signal``."""
    wall_s: float
    """Seconds from sending the code to the end of the run."""
    truncated: bool
    """The output went past ``Limits.output_bytes`` and was cut."""
    backend: str = ""
    """Name of the backend that ran it."""
    memory_guard: str = ""
    """What bounded the run's total memory: ``cgroup``, ``supervisor`` or ``docker`` (see
    ``MemoryGuardName``)."""
    disk_mb: int | None = None
    """Size of the run's scratch space in MiB; ``None`` where nothing bounds it (the subprocess backend)."""

    def to_dict(self) -> dict[str, object]:
        return {item.name: getattr(self, item.name) for item in fields(self)}


__all__ = ["KilledReason", "Limits", "MemoryGuardName", "Result"]
