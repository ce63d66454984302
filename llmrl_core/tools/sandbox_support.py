"""Parent-side helpers of the sandbox: output draining with a cap, the pids cgroup, readable paths."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import threading
import time
from typing import BinaryIO

SYSTEM_READABLE = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
    "/lib32",
    "/libx32",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/ssl",
    "/etc/mime.types",
    "/etc/os-release",
)


@functools.lru_cache(maxsize=8)
def _python_dirs(python: str) -> tuple[str, ...]:
    probe = "import sys, json; print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix] + sys.path))"
    out = subprocess.run([python, "-I", "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    return tuple(json.loads(out.stdout))


def readable_paths(python: str, extra: tuple[str, ...] = ()) -> list[str]:
    """Paths the sandboxed code may read: system libraries, the interpreter's prefixes and sys.path, ``extra``."""
    paths = list(SYSTEM_READABLE) + list(_python_dirs(python)) + list(extra)
    seen: list[str] = []
    for path in paths:
        if path and path != "/" and os.path.isabs(path) and os.path.exists(path) and path not in seen:
            seen.append(path)
    return seen


class OutputDrain:
    """Read a child's stdout or stderr continuously; keep the first ``cap`` bytes of each block.

    The child marks the end of a block's output with a random sentinel; bytes past the cap are counted
    and dropped (so a flood of output never blocks the child or fills memory). Between blocks, bytes are
    kept (capped) only for start-up diagnostics.
    """

    def __init__(self, stream: BinaryIO, cap: int) -> None:
        self._fd = stream.fileno()
        self._cap = cap
        self._cond = threading.Condition()
        self._sentinel: bytes | None = None
        self._head = bytearray()
        self._tail = b""
        self._total = 0
        self._done = False
        self._eof = False
        self._loose = bytearray()
        self._thread = threading.Thread(target=self._loop, name="sandbox-drain", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            try:
                chunk = os.read(self._fd, 1 << 16)
            except OSError:
                chunk = b""
            with self._cond:
                if not chunk:
                    self._eof = True
                    self._cond.notify_all()
                    return
                self._feed(chunk)

    def _keep(self, data: bytes) -> None:
        room = self._cap - len(self._head)
        if room > 0:
            self._head += data[:room]
        self._total += len(data)

    def _feed(self, chunk: bytes) -> None:
        if self._sentinel is None or self._done:
            if len(self._loose) < self._cap:
                self._loose += chunk[: self._cap - len(self._loose)]
            return
        data = self._tail + chunk
        found = data.find(self._sentinel)
        if found >= 0:
            self._keep(data[:found])
            self._tail = b""
            self._done = True
            self._cond.notify_all()
            return
        keep = len(self._sentinel) - 1
        if len(data) > keep:
            self._keep(data[:-keep])
            self._tail = data[-keep:]
        else:
            self._tail = data

    def begin(self, sentinel: bytes) -> None:
        """Start collecting one block's output, which ends at ``sentinel``."""
        with self._cond:
            self._sentinel, self._head, self._tail, self._total, self._done = sentinel, bytearray(), b"", 0, False
            self._loose = bytearray()

    def finish(self, timeout: float) -> tuple[str, bool]:
        """Wait up to ``timeout`` for the sentinel; returns (text, truncated)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not (self._done or self._eof) and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            if not self._done:
                self._keep(self._tail)
                self._tail = b""
            text = bytes(self._head).decode("utf-8", errors="replace")
            truncated = self._total > self._cap
            self._sentinel, self._done = None, False
            return text, truncated

    def take_all(self) -> bytes:
        """Everything kept outside a block (start-up messages)."""
        with self._cond:
            return bytes(self._loose)

    def close(self, timeout: float = 1.0) -> None:
        """Wait briefly for the reader thread to see end of file."""
        self._thread.join(timeout)


class PidsCgroup:
    """A cgroup of the ``pids`` controller capping the sandbox's process count (needs root)."""

    def __init__(self, path: str) -> None:
        self.path = path

    @property
    def procs_file(self) -> str:
        """The file a process writes its pid into to join."""
        return os.path.join(self.path, "cgroup.procs")

    @classmethod
    def create(cls, max_pids: int) -> PidsCgroup | None:
        """Create a child cgroup of this process's pids cgroup with ``pids.max``; None if not possible."""
        base = _own_pids_cgroup_dir()
        if base is None:
            return None
        path = os.path.join(base, f"llmrl-sandbox-{os.getpid()}-{time.monotonic_ns()}")
        try:
            os.mkdir(path)
            with open(os.path.join(path, "pids.max"), "w") as fh:
                fh.write(str(max_pids))
        except OSError:
            try:
                os.rmdir(path)
            except OSError:
                pass
            return None
        return cls(path)

    def kill_all(self) -> None:
        """SIGKILL every process in the cgroup (some may have left the sandbox's process group)."""
        for _ in range(5):
            try:
                with open(self.procs_file) as fh:
                    pids = [int(p) for p in fh.read().split()]
            except OSError:
                return
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.05)

    def remove(self) -> None:
        """Kill what is left and delete the cgroup."""
        self.kill_all()
        for _ in range(40):
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.05)


def _own_pids_cgroup_dir() -> str | None:
    try:
        with open("/proc/self/cgroup") as fh:
            lines = fh.read().splitlines()
        with open("/proc/self/mountinfo") as fh:
            mounts = fh.read().splitlines()
    except OSError:
        return None
    rel_v1 = rel_v2 = None
    for line in lines:
        hid, controllers, rel = line.split(":", 2)
        if "pids" in controllers.split(","):
            rel_v1 = rel
        elif hid == "0":
            rel_v2 = rel
    for line in mounts:
        pre, _, post = line.partition(" - ")
        fields, post_fields = pre.split(), post.split()
        if len(fields) < 5 or len(post_fields) < 3:
            continue
        root, mountpoint, fstype, opts = fields[3], fields[4], post_fields[0], post_fields[2]
        if fstype == "cgroup" and rel_v1 is not None and "pids" in opts.split(","):
            return _join(mountpoint, root, rel_v1)
        if fstype == "cgroup2" and rel_v1 is None and rel_v2 is not None:
            path = _join(mountpoint, root, rel_v2)
            try:
                with open(os.path.join(path, "cgroup.subtree_control")) as fh:
                    if "pids" in fh.read().split():
                        return path
            except OSError:
                return None
    return None


def _join(mountpoint: str, root: str, rel: str) -> str | None:
    if root != "/" and rel.startswith(root):
        rel = rel[len(root) :]
    path = os.path.join(mountpoint, rel.lstrip("/"))
    return path if os.path.isdir(path) else None
