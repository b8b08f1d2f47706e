"""The seccomp filter of the bwrap sandbox: ``DENIED_SYSCALLS`` and ``build_filter`` (classic BPF bytes).

bwrap's ``--seccomp FD`` loads a compiled classic-BPF program (an array of ``struct sock_filter``)
before it runs the sandboxed command. The program is assembled here with ``struct``, so the sandbox
needs no libseccomp. It denies what sandboxed code has no use for and what would let it step out
of the box's resource accounting:

- namespaces and mounts: ``unshare``, ``setns``, ``clone`` with any ``CLONE_NEW*`` flag, ``mount``
  and the new mount API, ``pivot_root``, ``chroot``. A nested user namespace would hand the code
  every capability inside it, and with them tmpfs mounts: host RAM that no limit counts.
  ``clone3`` answers ``ENOSYS`` (its flags sit in memory a filter cannot read), so the C library
  falls back to ``clone``, whose flags the filter checks.
- memory outside every rlimit: ``memfd_create``, System V shared memory and message queues.
- kernel attack surface: ``bpf``, ``perf_event_open``, ``userfaultfd``, ``io_uring_*`` (its
  operations bypass seccomp), keyrings, ``ptrace``, ``process_vm_*``, ``pidfd_getfd``, module
  loading, ``kexec``, handle-based opens, ``fanotify_init``, and the admin calls (reboot, swap,
  clock, hostname, quota, accounting, ``syslog``, ``vhangup``, port I/O).

Every other syscall is allowed. A syscall from another ABI (32-bit ``int 0x80`` on x86_64, x32)
kills the process: the numbers above mean nothing there.

Example:
    >>> program = build_filter("x86_64")
    >>> len(program) % 8, len(program) // 8 > len(DENIED_SYSCALLS)
    (0, True)
"""

from __future__ import annotations

import errno
import platform
import struct

from agentgym.errors import ConfigError

#: Denied syscalls (answer ``EPERM``), by name; ``clone`` is denied only with a ``CLONE_NEW*`` flag.
DENIED_SYSCALLS = (
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr",
    "memfd_create", "shmget", "shmat", "shmdt", "shmctl", "msgget", "msgsnd", "msgrcv", "msgctl",
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "keyctl", "add_key", "request_key", "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "name_to_handle_at", "open_by_handle_at", "fanotify_init", "lookup_dcookie",
    "reboot", "swapon", "swapoff", "settimeofday", "sethostname", "setdomainname", "quotactl", "quotactl_fd",
    "acct", "syslog", "vhangup", "iopl", "ioperm", "uselib",
)
#: ``clone`` flags that make a namespace (CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET).
CLONE_NEW_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

# Syscall numbers (Linux uapi headers: arch/x86/entry/syscalls/syscall_64.tbl and the generic table
# aarch64 uses). A name an architecture lacks (iopl on aarch64) is simply absent.
_X86_64 = {
    "shmget": 29, "shmat": 30, "shmctl": 31, "clone": 56, "shmdt": 67, "msgget": 68, "msgsnd": 69,
    "msgrcv": 70, "msgctl": 71, "ptrace": 101, "syslog": 103, "uselib": 134, "vhangup": 153,
    "pivot_root": 155, "chroot": 161, "acct": 163, "settimeofday": 164, "mount": 165, "umount2": 166,
    "swapon": 167, "swapoff": 168, "reboot": 169, "sethostname": 170, "setdomainname": 171, "iopl": 172,
    "ioperm": 173, "init_module": 175, "delete_module": 176, "quotactl": 179, "lookup_dcookie": 212,
    "kexec_load": 246, "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272,
    "perf_event_open": 298, "fanotify_init": 300, "name_to_handle_at": 303, "open_by_handle_at": 304,
    "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311, "finit_module": 313,
    "memfd_create": 319, "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
    "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "clone3": 435,
    "pidfd_getfd": 438, "mount_setattr": 442, "quotactl_fd": 443,
}
_AARCH64 = {
    "lookup_dcookie": 18, "umount2": 39, "mount": 40, "pivot_root": 41, "chroot": 51, "vhangup": 58,
    "quotactl": 60, "acct": 89, "unshare": 97, "kexec_load": 104, "init_module": 105, "delete_module": 106,
    "syslog": 116, "ptrace": 117, "reboot": 142, "sethostname": 161, "setdomainname": 162,
    "settimeofday": 170, "msgget": 186, "msgctl": 187, "msgrcv": 188, "msgsnd": 189, "shmget": 194,
    "shmctl": 195, "shmat": 196, "shmdt": 197, "add_key": 217, "request_key": 218, "keyctl": 219,
    "clone": 220, "swapon": 224, "swapoff": 225, "perf_event_open": 241, "fanotify_init": 262,
    "name_to_handle_at": 264, "open_by_handle_at": 265, "setns": 268, "process_vm_readv": 270,
    "process_vm_writev": 271, "finit_module": 273, "memfd_create": 279, "bpf": 280, "userfaultfd": 282,
    "kexec_file_load": 294, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "clone3": 435, "pidfd_getfd": 438, "mount_setattr": 442, "quotactl_fd": 443,
}
#: ``(AUDIT_ARCH_*, syscall numbers, x32 bit)`` by ``platform.machine()``.
_ARCHES: dict[str, tuple[int, dict[str, int], int | None]] = {
    "x86_64": (0xC000003E, _X86_64, 0x40000000),
    "aarch64": (0xC00000B7, _AARCH64, None),
}
_ARCHES["amd64"] = _ARCHES["x86_64"]
_ARCHES["arm64"] = _ARCHES["aarch64"]

# Classic BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h).
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000
# Offsets in struct seccomp_data: nr (int), arch (u32), instruction_pointer (u64), args[6] (u64).
_NR, _ARCH, _ARG0_LOW = 0, 4, 16  # args[0]'s low 32 bits on little-endian machines


def supported_machines() -> tuple[str, ...]:
    """The ``platform.machine()`` values a filter can be built for."""
    return tuple(sorted(_ARCHES))


def build_filter(machine: str | None = None) -> bytes:
    """The compiled filter for ``machine`` (default: this one), ready for bwrap's ``--seccomp FD``.

    Args:
        machine: a ``platform.machine()`` value, e.g. ``"x86_64"`` or ``"aarch64"``.

    Returns:
        The ``struct sock_filter`` array as bytes (8 bytes per instruction, native byte order).

    Raises:
        ConfigError: no syscall table for this machine (the message lists the supported ones).
    """
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        raise ConfigError(f"no seccomp syscall table for machine {machine!r} (supported: "
                          f"{', '.join(supported_machines())}); pass seccomp=False to BwrapBackend to run "
                          "without the filter, knowing that nested namespaces are then allowed")
    audit_arch, numbers, x32_bit = _ARCHES[machine]
    denied = [numbers[name] for name in DENIED_SYSCALLS if name in numbers]
    # The program, as (code, jt, jf, k) with jumps relative to the next instruction (classic BPF
    # jumps only forward). Tail layout: ALLOW, the clone flag check, EPERM, ENOSYS, KILL.
    checks: list[tuple[int, str | None, str | None, int]] = [
        (_LD_W_ABS, None, None, _ARCH),
        (_JEQ_K, None, "kill", audit_arch),
        (_LD_W_ABS, None, None, _NR),
    ]
    if x32_bit is not None:
        checks.append((_JGE_K, "kill", None, x32_bit))
    checks.append((_JEQ_K, "enosys", None, numbers["clone3"]))
    checks.append((_JEQ_K, "clone", None, numbers["clone"]))
    checks += [(_JEQ_K, "eperm", None, number) for number in denied]
    tail: list[tuple[str | None, tuple[int, str | None, str | None, int]]] = [
        ("allow", (_RET_K, None, None, _RET_ALLOW)),
        ("clone", (_LD_W_ABS, None, None, _ARG0_LOW)),
        (None, (_JSET_K, "eperm", None, CLONE_NEW_FLAGS)),
        (None, (_RET_K, None, None, _RET_ALLOW)),
        ("eperm", (_RET_K, None, None, _RET_ERRNO | errno.EPERM)),
        ("enosys", (_RET_K, None, None, _RET_ERRNO | errno.ENOSYS)),
        ("kill", (_RET_K, None, None, _RET_KILL_PROCESS)),
    ]
    program = checks + [insn for _, insn in tail]
    labels = {name: len(checks) + index for index, (name, _) in enumerate(tail) if name is not None}
    out = bytearray()
    for position, (code, jump_true, jump_false, k) in enumerate(program):
        offsets = []
        for target in (jump_true, jump_false):
            offset = 0 if target is None else labels[target] - position - 1
            if not 0 <= offset <= 255:
                raise AssertionError(f"BPF jump out of range: {offset}")  # internal: the table grew too long
            offsets.append(offset)
        out += struct.pack("=HBBI", code, offsets[0], offsets[1], k)
    return bytes(out)


__all__ = ["CLONE_NEW_FLAGS", "DENIED_SYSCALLS", "build_filter", "supported_machines"]
