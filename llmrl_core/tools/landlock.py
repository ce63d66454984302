"""Landlock (Linux >= 5.13) through ctypes: confine a process's file and TCP access, unprivileged.

Landlock is an allow-list LSM: a process builds a ruleset ("these rights are handled"), adds rules
("these rights are allowed beneath this directory"), and restricts itself. From then on every handled
right not granted by a rule is denied, for the process and all its descendants, root included, and the
restriction cannot be lifted. It needs no privileges (only ``no_new_privs``), which is why the sandbox
uses it both as root (CI) and as an ordinary user.

Feature levels ("ABI") grow with the kernel: 1 file access, 2 cross-directory rename (REFER),
3 truncate, 4 TCP bind/connect, 5 device ioctl, 6 scoping of abstract unix sockets and signals.
:func:`abi_version` reports the level and :class:`LandlockRuleset` asks only for what the kernel knows.
Stdlib only: this module is imported inside the sandbox before the restriction is applied.
"""

from __future__ import annotations

import ctypes
import os
import platform

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446  # same numbers on all 64-bit arches
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH, _RULE_NET_PORT = 1, 2
_PR_SET_NO_NEW_PRIVS = 38

FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
FS_IOCTL_DEV = 1 << 15  # ABI 5
NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6

_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
FILE_ONLY_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
READ_RIGHTS = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR


class LandlockError(OSError):
    """Landlock is missing or refused a request (the message names the step and the path)."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPortAttr(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def abi_version() -> int:
    """The kernel's Landlock ABI level, 0 when Landlock is unavailable (not Linux, disabled, too old)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "aarch64", "riscv64", "ppc64le", "s390x"):
        return 0
    try:
        res = _libc().syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(int(res), 0)


class LandlockRuleset:
    """Build and apply a Landlock ruleset: handled rights, per-directory grants, TCP and scope limits.

    ``deny_tcp`` handles TCP bind and connect with no port rule, so both are refused (ABI >= 4);
    ``scope`` confines abstract unix sockets and signals to the sandbox's own processes (ABI >= 6).
    """

    def __init__(self, abi: int | None = None, deny_tcp: bool = True, scope: bool = True) -> None:
        self.abi = abi_version() if abi is None else abi
        if self.abi < 1:
            raise LandlockError("Landlock is not available on this kernel")
        self.handled_fs = _FS_BY_ABI.get(self.abi, _FS_BY_ABI[5])
        self.handled_net = NET_BIND_TCP | NET_CONNECT_TCP if (deny_tcp and self.abi >= 4) else 0
        self.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if (scope and self.abi >= 6) else 0
        self._grants: list[tuple[str, int]] = []

    def allow(self, path: str, rights: int) -> bool:
        """Grant ``rights`` beneath ``path`` (file-only rights for a file). Missing paths are skipped (False)."""
        if not os.path.exists(path):
            return False
        rights &= self.handled_fs
        if not os.path.isdir(path):
            rights &= FILE_ONLY_RIGHTS
        self._grants.append((path, rights))
        return True

    def allow_read(self, path: str) -> bool:
        """Grant read, list and execute beneath ``path``."""
        return self.allow(path, READ_RIGHTS)

    def allow_write(self, path: str) -> bool:
        """Grant every file right beneath ``path`` (create, write, remove, ...)."""
        return self.allow(path, self.handled_fs)

    def restrict_self(self) -> None:
        """Apply the ruleset to this process (and every later child). Irreversible."""
        libc = _libc()
        attr = _RulesetAttr(self.handled_fs, self.handled_net, self.scoped)
        size = 8 if self.abi < 4 else (16 if self.abi < 6 else 24)
        ruleset_fd = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
        if ruleset_fd < 0:
            raise LandlockError(ctypes.get_errno(), f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
        try:
            for path, rights in self._grants:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                try:
                    rule = _PathBeneathAttr(rights, fd)
                    if libc.syscall(_SYS_ADD_RULE, ruleset_fd, _RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
                        err = ctypes.get_errno()
                        raise LandlockError(err, f"landlock_add_rule({path!r}): {os.strerror(err)}")
                finally:
                    os.close(fd)
            if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
                err = ctypes.get_errno()
                raise LandlockError(err, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(err)}")
            if libc.syscall(_SYS_RESTRICT_SELF, ruleset_fd, 0) != 0:
                err = ctypes.get_errno()
                raise LandlockError(err, f"landlock_restrict_self: {os.strerror(err)}")
        finally:
            os.close(ruleset_fd)
