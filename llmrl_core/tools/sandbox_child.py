"""The inside of the sandbox: confine this process, then serve code blocks to the parent.

Run by :class:`llmrl_core.tools.sandbox.Sandbox` as ``python -I -c <bootstrap> <config-json>``; it must
only use the standard library. Confinement happens in this order, each step recorded in the report
sent back to the parent (so a weaker fallback is always visible, never silent):

1. namespaces: as root ``unshare(NEWNET|NEWNS|NEWPID|NEWIPC|NEWUTS)``; as a user the same plus
   ``NEWUSER`` (own uid mapped to itself). A new network namespace has no interface but a downed
   loopback, so nothing at all is reachable. If the kernel refuses, the process runs without them.
2. cgroup: when the parent prepared a ``pids`` cgroup (root only), join it (process-count limit).
3. with a PID namespace, fork: the child is PID 1 of the namespace (``PR_SET_PDEATHSIG``); when it
   dies the kernel kills every process in it, so a fork bomb never outlives the sandbox. A fresh
   ``/proc`` is mounted so the parent's processes (and their ``environ``) are invisible.
4. rlimits: CPU seconds, address space, file size, open files, processes, no core dumps.
5. Landlock: read/execute only system and Python directories, write only the working directory,
   no TCP bind/connect, no signals or abstract sockets outside the sandbox.
6. capabilities: the bounding, ambient, effective and permitted sets are emptied, so root inside
   cannot raise its rlimits, bypass file permissions, mount, or trace.
7. an audit hook refuses IP sockets at the Python level (the only network guard when namespaces and
   Landlock TCP rules are both unavailable; documented as weaker, ctypes can bypass it).

Then the request loop: each request frame carries a code block; it runs in one persistent globals
dict, stdout/stderr go to the real file descriptors (pipes the parent drains and caps), and a random
sentinel is written on both after the block so the parent can cut the streams per block.
"""

from __future__ import annotations

import ctypes
import json
import linecache
import os
import resource
import signal
import struct
import sys
import traceback

from llmrl_core.tools import landlock

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 1, 24, 47, 4
_LIBC = ctypes.CDLL(None, use_errno=True)
_SERVER_PID = 0
_LIMITS = {"wall-clock": 0.0, "CPU": 0.0}


class BlockTimeout(Exception):
    """Raised inside a code block when its wall-clock or CPU time runs out."""


def _check(res: int, what: str) -> None:
    if res != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _write_file(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _unshare(report: dict, want_pidns: bool) -> bool:
    """Enter new namespaces; returns whether a PID namespace was created (a fork must follow)."""
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS | (CLONE_NEWPID if want_pidns else 0)
    if uid != 0:
        flags |= CLONE_NEWUSER
    try:
        _check(_LIBC.unshare(flags), "unshare")
    except OSError as exc:
        report["namespaces"] = f"unavailable ({exc.strerror}); running in the host namespaces"
        return False
    if uid != 0:
        _write_file("/proc/self/setgroups", "deny")
        _write_file("/proc/self/uid_map", f"{uid} {uid} 1")
        _write_file("/proc/self/gid_map", f"{gid} {gid} 1")
    report["namespaces"] = "net,mnt,ipc,uts" + (",pid" if want_pidns else "") + (",user" if uid != 0 else "")
    report["network"] = "isolated (new network namespace, no interfaces up)"
    return want_pidns


def _fork_into_pidns(report: dict) -> None:
    """Fork; the parent waits and mirrors the exit status, the child (PID 1) carries on."""
    pid = os.fork()
    if pid:
        signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGKILL))
        while True:
            try:
                _, status = os.waitpid(pid, 0)
                break
            except InterruptedError:
                continue
        code = os.waitstatus_to_exitcode(status)
        os._exit(code if code >= 0 else 128 - code)
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    try:
        _check(_LIBC.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
        _check(_LIBC.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mount proc")
        report["proc"] = "private (only the sandbox's processes are visible)"
    except OSError as exc:
        report["proc"] = f"host /proc hidden by Landlock ({exc.strerror})"


def _join_cgroup(procs_file: str, report: dict) -> None:
    try:
        _write_file(procs_file, str(os.getpid()))
        report["processes"] = f"cgroup pids.max ({os.path.dirname(procs_file)})"
    except OSError as exc:
        report["processes"] = f"RLIMIT_NPROC only (cgroup join failed: {exc.strerror})"


def _set_rlimits(limits: dict, report: dict) -> None:
    as_bytes, cpu = int(limits["memory_bytes"]), int(limits["lifetime_cpu_s"])
    pairs = {
        resource.RLIMIT_CPU: (cpu, cpu + 1),
        resource.RLIMIT_AS: (as_bytes, as_bytes),
        resource.RLIMIT_FSIZE: (int(limits["max_file_bytes"]),) * 2,
        resource.RLIMIT_NOFILE: (int(limits["max_open_files"]),) * 2,
        resource.RLIMIT_CORE: (0, 0),
    }
    nproc = int(limits["max_processes"])
    if os.getuid() != 0:  # RLIMIT_NPROC counts every process of the uid, so leave room for the existing ones
        nproc += _count_own_processes()
    pairs[resource.RLIMIT_NPROC] = (nproc, nproc)
    for which, value in pairs.items():
        resource.setrlimit(which, value)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over-size writes fail with EFBIG instead of killing
    report.setdefault("processes", "RLIMIT_NPROC" if os.getuid() != 0 else "unlimited (root ignores RLIMIT_NPROC)")


def _count_own_processes() -> int:
    uid, count = os.getuid(), 0
    try:
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    count += os.stat(f"/proc/{name}").st_uid == uid
                except OSError:
                    pass
    except OSError:
        return 0
    return count


def _landlock(cfg: dict, report: dict) -> None:
    abi = landlock.abi_version()
    if abi < 1:
        report["filesystem"] = "no Landlock: plain file permissions only"
        return
    rules = landlock.LandlockRuleset(abi)
    for path in cfg["readable"]:
        rules.allow_read(path)
    if report.get("proc", "").startswith("private"):
        rules.allow_read("/proc")
    for dev in ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"):
        rules.allow(dev, landlock.FS_READ_FILE | landlock.FS_WRITE_FILE | landlock.FS_IOCTL_DEV)
    rules.allow_write(cfg["workdir"])
    rules.restrict_self()
    report["filesystem"] = f"Landlock ABI {abi}: write only in the working directory, read system/Python dirs"
    if rules.handled_net:
        report.setdefault("network", "Landlock: TCP bind/connect refused (other IP sockets: Python audit hook only)")
        report["tcp"] = "Landlock: TCP bind/connect refused"


def _drop_capabilities(report: dict) -> None:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as fh:
            last = int(fh.read())
    except OSError:
        last = 63
    for cap in range(last + 1):
        _LIBC.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    _LIBC.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = struct.pack("Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = bytes(24)  # two {effective, permitted, inheritable} = 0
    hdr_buf, data_buf = ctypes.create_string_buffer(header, 8), ctypes.create_string_buffer(data, 24)
    _check(_LIBC.capset(hdr_buf, data_buf), "capset")
    report["capabilities"] = "none"


def _audit_hook(event: str, args: tuple) -> None:
    if event == "socket.__new__" and len(args) >= 2 and args[1] in (2, 10):  # AF_INET, AF_INET6
        raise PermissionError("network access is disabled in this sandbox")
    if event in ("socket.connect", "socket.bind", "socket.getaddrinfo", "socket.sendto"):
        raise PermissionError("network access is disabled in this sandbox")


def confine(cfg: dict) -> dict:
    """Apply every confinement step; returns the report of what is in force."""
    report: dict = {"uid": os.getuid()}
    if cfg.get("cgroup_procs"):
        _join_cgroup(cfg["cgroup_procs"], report)
    if cfg.get("namespaces", True) and _unshare(report, want_pidns=True):
        _fork_into_pidns(report)
    report.setdefault("proc", "host /proc hidden by Landlock")
    _set_rlimits(cfg["limits"], report)
    if cfg.get("landlock", True):
        _landlock(cfg, report)
    else:
        report["filesystem"] = "Landlock disabled by configuration"
    try:
        _drop_capabilities(report)
    except OSError as exc:
        report["capabilities"] = f"not dropped ({exc.strerror})"
    sys.addaudithook(_audit_hook)
    report.setdefault("network", "Python audit hook only (IP sockets refused; ctypes could bypass)")
    os.chdir(cfg["workdir"])
    os.umask(0o077)
    return report


def _read_exact(fd: int, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def read_frame(fd: int) -> dict | None:
    """One length-prefixed JSON frame, or None at end of file."""
    head = _read_exact(fd, 4)
    if head is None:
        return None
    body = _read_exact(fd, struct.unpack(">I", head)[0])
    return None if body is None else json.loads(body)


def write_frame(fd: int, obj: dict) -> None:
    """Write one length-prefixed JSON frame."""
    body = json.dumps(obj).encode()
    os.write(fd, struct.pack(">I", len(body)) + body)


def _child_exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _on_timeout(signum: int, _frame: object) -> None:
    kind = "wall-clock" if signum == signal.SIGALRM else "CPU"
    raise BlockTimeout(f"{kind} time limit exceeded ({_LIMITS[kind]:g} s)")


def _run_block(code: str, namespace: dict) -> tuple[bool, str]:
    lines = code.splitlines(True)
    if lines and not lines[-1].endswith("\n"):
        # traceback counts the line's newline among the characters it strips before placing the carets (as
        # linecache does for files, end every line with one), else a last line without one has them a column right
        lines[-1] += "\n"
    linecache.cache["<code block>"] = (len(code), None, lines, "<code block>")
    try:
        exec(compile(code, "<code block>", "exec"), namespace)  # noqa: S102 (running untrusted code is the job)
        return True, ""
    except SystemExit as exc:
        ok = exc.code in (None, 0)
        return ok, "" if ok else f"SystemExit({exc.code!r})"
    except BaseException as exc:  # noqa: BLE001 (any failure of the block is reported, never raised)
        if os.getpid() != _SERVER_PID:
            _child_exit(1)  # a process forked by the block must never run the server loop
        tb = traceback.extract_tb(exc.__traceback__)
        tb = [frame for frame in tb if frame.filename == "<code block>"]
        if isinstance(exc, BlockTimeout):
            sys.stderr.write("Traceback (most recent call last):\n" + "".join(traceback.format_list(tb)))
            sys.stderr.write(f"TimeoutError: {exc}\n")
            return False, str(exc)
        lines = traceback.format_list(tb) + traceback.format_exception_only(type(exc), exc)
        sys.stderr.write("Traceback (most recent call last):\n" + "".join(lines))
        return False, type(exc).__name__


def _reap(kill_all: bool) -> None:
    """After a block: as PID 1 of the namespace kill every stray process, then reap all exited children."""
    if kill_all:
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
    while True:
        try:
            pid, _ = os.waitpid(-1, 0 if kill_all else os.WNOHANG)
        except ChildProcessError:
            return
        except InterruptedError:
            continue
        if pid == 0:
            return


def serve(req_fd: int, resp_fd: int, cfg: dict) -> None:
    """Run code blocks until the parent closes the request pipe."""
    global _SERVER_PID
    _SERVER_PID = os.getpid()
    namespace: dict = {"__name__": "__main__", "__builtins__": __builtins__}
    while (req := read_frame(req_fd)) is not None:
        signal.signal(signal.SIGALRM, _on_timeout)  # every block: the last one may have changed them
        signal.signal(signal.SIGXCPU, _on_timeout)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        used = resource.getrusage(resource.RUSAGE_SELF)
        soft = int(used.ru_utime + used.ru_stime) + int(req["cpu_s"]) + 1
        hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        resource.setrlimit(resource.RLIMIT_CPU, (min(soft, hard - 1), hard))
        _LIMITS["wall-clock"], _LIMITS["CPU"] = float(req["wall_s"]), float(req["cpu_s"])
        signal.setitimer(signal.ITIMER_REAL, float(req["wall_s"]))
        try:
            ok, error = _run_block(req["code"], namespace)
        except BlockTimeout as exc:  # the alarm fired while the traceback was being written
            ok, error = False, str(exc)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if os.getpid() != _SERVER_PID:
            _child_exit(0)
        _reap(kill_all=bool(cfg.get("_pidns")))
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        sentinel = req["sentinel"].encode()
        for fd in (1, 2):
            try:
                os.write(fd, sentinel)
            except OSError:
                pass
        write_frame(resp_fd, {"ok": ok, "error": error})


def main() -> None:
    """Entry point: confine, announce the report on the response pipe, then serve."""
    cfg = json.loads(sys.argv[1])
    req_fd = os.dup(0)
    resp_fd = os.dup(int(cfg["resp_fd"]))
    os.close(int(cfg["resp_fd"]))
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.set_inheritable(req_fd, False)
    os.set_inheritable(resp_fd, False)
    try:
        report = confine(cfg)
    except Exception as exc:  # noqa: BLE001 (tell the parent why the sandbox could not start)
        write_frame(resp_fd, {"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        raise SystemExit(70) from exc
    cfg["_pidns"] = os.getpid() == 1
    write_frame(resp_fd, {"ready": True, "report": report})
    serve(req_fd, resp_fd, cfg)
