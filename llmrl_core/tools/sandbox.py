"""Run untrusted Python (model-written code) in a confined, resource-limited subprocess.

:class:`Sandbox` is one long-lived sandboxed interpreter: :meth:`Sandbox.run` executes a code block
in it and keeps the globals for the next block (the persistent mode of ``PythonInterpreter``);
:func:`run_python` is the one-shot form (fresh interpreter, one block, gone).

What confines the code (details and order in :mod:`llmrl_core.tools.sandbox_child`):

* a separate process, started with a scrubbed environment (only ``PATH``, ``HOME``/``TMPDIR`` = the
  working directory, locale and thread-count variables, plus what the caller passes explicitly) in a
  throwaway working directory (mode 0700, deleted on close);
* limits: wall clock (``SIGALRM`` in the block, then ``SIGKILL`` of the whole sandbox from here),
  CPU seconds per block (``SIGXCPU``) and over the interpreter's life (``RLIMIT_CPU``), address space,
  file size, open files, process count (a ``pids`` cgroup when running as root, since root ignores
  ``RLIMIT_NPROC``; ``RLIMIT_NPROC`` otherwise), and an output cap (the rest is drained and counted);
* no network: a new network namespace (root: plain ``unshare``; a user: inside a new user namespace),
  and Landlock refusing TCP bind/connect; where neither exists, a Python audit hook (documented as
  weaker). Files: Landlock lets the code write only in its working directory and read only system and
  Python directories, so the parent's files, home directory and ``/proc/<pid>/environ`` stay out of reach;
* all capabilities dropped, so root inside cannot lift any of this.

A crash, a kill or a timeout never raises here: it comes back as an :class:`ExecResult` whose
``status`` and ``error`` say what happened, and the next :meth:`Sandbox.run` starts a fresh interpreter.
:attr:`Sandbox.isolation` reports which mechanisms are actually in force on this machine; when one is missing
(:func:`isolation_gaps`), the first sandbox of a process logs a warning naming it (``llmrl.sandbox``).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from llmrl_core.tools.sandbox_support import OutputDrain, PidsCgroup, readable_paths

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
_LIVE: weakref.WeakSet[Sandbox] = weakref.WeakSet()
_WARNED_GAPS: set[tuple[str, ...]] = set()  # the isolation gaps this process has logged (once each)
log = logging.getLogger("llmrl.sandbox")
_BOOTSTRAP = "import sys; sys.path.insert(0, {root!r}); from llmrl_core.tools.sandbox_child import main; main()"


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed interpreter (times in seconds, sizes in bytes)."""

    wall_time_s: float = 10.0
    cpu_time_s: float = 10.0
    lifetime_cpu_s: float = 600.0
    memory_bytes: int = 1 << 31
    max_processes: int = 32
    max_file_bytes: int = 64 << 20
    max_open_files: int = 256
    output_bytes: int = 16_384

    def __post_init__(self) -> None:
        for name, value in self.__dict__.items():
            if not value or value <= 0:
                raise ValueError(f"SandboxLimits.{name} must be > 0, got {value!r}")


@dataclass(frozen=True)
class SandboxConfig:
    """How to start a sandbox: limits, interpreter, which confinement layers to use, extra paths/env."""

    limits: SandboxLimits = field(default_factory=SandboxLimits)
    python: str = sys.executable
    namespaces: bool = True
    landlock: bool = True
    cgroup: bool = True
    extra_readable: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    workdir_parent: str | None = None
    startup_timeout_s: float = 30.0
    kill_grace_s: float = 2.0


@dataclass
class ExecResult:
    """The outcome of one code block.

    ``status`` is ``"ok"``, ``"error"`` (the code raised; the interpreter lives on), ``"timeout"``
    (``error`` says wall-clock or CPU) or ``"crashed"`` (the interpreter died or was killed; state lost).
    """

    ok: bool
    status: str
    stdout: str = ""
    stderr: str = ""
    error: str = ""
    truncated: bool = False
    duration_s: float = 0.0
    state_lost: bool = False


class SandboxError(RuntimeError):
    """The sandbox could not be started (the message says which step failed)."""


class Sandbox:
    """One sandboxed Python interpreter whose globals persist across :meth:`run` calls."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self.isolation: dict = {}
        self._proc: subprocess.Popen | None = None
        self._workdir: str | None = None
        self._cgroup: PidsCgroup | None = None
        self._resp_fd = -1
        self._drains: tuple[OutputDrain, OutputDrain] | None = None
        self._had_state = False
        self._eof = False

    @property
    def workdir(self) -> str | None:
        """The throwaway working directory of the running interpreter (None when stopped)."""
        return self._workdir

    @property
    def alive(self) -> bool:
        """Whether the interpreter process is running."""
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start a fresh interpreter (stops a running one first)."""
        self.close()
        cfg, limits = self.config, self.config.limits
        self._workdir = tempfile.mkdtemp(prefix="llmrl-sandbox-", dir=cfg.workdir_parent)
        os.chmod(self._workdir, 0o700)
        if cfg.cgroup and os.geteuid() == 0:
            self._cgroup = PidsCgroup.create(limits.max_processes)
        resp_r, resp_w = os.pipe()
        child_cfg = {
            "workdir": self._workdir,
            "resp_fd": resp_w,
            "namespaces": cfg.namespaces,
            "landlock": cfg.landlock,
            "readable": readable_paths(cfg.python, cfg.extra_readable),
            "cgroup_procs": self._cgroup.procs_file if self._cgroup else None,
            "limits": {
                "memory_bytes": limits.memory_bytes,
                "lifetime_cpu_s": limits.lifetime_cpu_s,
                "max_file_bytes": limits.max_file_bytes,
                "max_open_files": limits.max_open_files,
                "max_processes": limits.max_processes,
            },
        }
        try:
            self._proc = subprocess.Popen(
                [cfg.python, "-I", "-c", _BOOTSTRAP.format(root=_PACKAGE_ROOT), json.dumps(child_cfg)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(resp_w,),
                cwd=self._workdir,
                env=self._child_env(),
                start_new_session=True,
            )
        finally:
            os.close(resp_w)
        self._resp_fd = resp_r
        self._drains = (
            OutputDrain(self._proc.stdout, limits.output_bytes),
            OutputDrain(self._proc.stderr, limits.output_bytes),
        )
        hello = self._read_response(time.monotonic() + cfg.startup_timeout_s)
        if not hello or not hello.get("ready"):
            why = (hello or {}).get("error") or self._death_reason() or "no answer"
            err = self._drains[1].take_all().decode(errors="replace")[-2000:]
            self.close()
            raise SandboxError(f"sandbox failed to start: {why}\n{err}".rstrip())
        self.isolation = hello["report"]
        _warn_once(isolation_gaps(self.isolation))
        self._had_state = False
        _LIVE.add(self)

    def _child_env(self) -> dict[str, str]:
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": self._workdir or "/",
            "TMPDIR": self._workdir or "/",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "PYTHONIOENCODING": "utf-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
        env.update(self.config.env)
        return env

    def run(self, code: str, wall_time_s: float | None = None, cpu_time_s: float | None = None) -> ExecResult:
        """Execute ``code`` in the interpreter; never raises for anything the code does."""
        limits = self.config.limits
        wall = wall_time_s or limits.wall_time_s
        cpu = cpu_time_s or limits.cpu_time_s
        state_lost = False
        if not self.alive:
            state_lost = self._had_state
            self.start()
        assert self._proc is not None and self._proc.stdin is not None and self._drains is not None
        sentinel = "\x00" + secrets.token_hex(16) + "\x00"
        for drain in self._drains:
            drain.begin(sentinel.encode())
        request = json.dumps({"code": code, "sentinel": sentinel, "wall_s": wall, "cpu_s": cpu}).encode()
        start = time.monotonic()
        try:
            self._proc.stdin.write(len(request).to_bytes(4, "big") + request)
            self._proc.stdin.flush()
        except OSError:
            pass  # the child is gone; the response read below reports it
        self._had_state = True
        response = self._read_response(start + wall + self.config.kill_grace_s)
        elapsed = time.monotonic() - start
        if response is None:
            timed_out = not self._eof
            reason = "" if timed_out else self._death_reason()
            self.kill()
            (out, out_cut), (err, err_cut) = (d.finish(0.2) for d in self._drains)
            if timed_out:
                status, error = "timeout", f"wall-clock time limit exceeded ({wall:g} s); the interpreter was killed"
            else:
                status, error = "crashed", f"the interpreter died ({reason})"
            return ExecResult(False, status, out, err, error, out_cut or err_cut, elapsed, True)
        (out, out_cut), (err, err_cut) = (d.finish(2.0) for d in self._drains)
        ok, error = bool(response.get("ok")), str(response.get("error", ""))
        status = "ok" if ok else ("timeout" if "time limit exceeded" in error else "error")
        return ExecResult(ok, status, out, err, error, out_cut or err_cut, elapsed, state_lost)

    def _read_response(self, deadline: float) -> dict | None:
        """One response frame, or None if the child died (``_eof`` set) or the deadline passed."""
        self._eof = False
        buf = b""
        while True:
            need = 4 if len(buf) < 4 else 4 + int.from_bytes(buf[:4], "big")
            if len(buf) >= need and len(buf) >= 4 and need > 4:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([self._resp_fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(self._resp_fd, 65536)
            if not chunk:
                self._eof = True
                return None
            buf += chunk
        try:
            return json.loads(buf[4:need])
        except ValueError:
            return None

    def _death_reason(self) -> str:
        if self._proc is None:
            return "not started"
        try:
            code = self._proc.wait(timeout=3.0)
        except subprocess.TimeoutExpired:
            return "still running"
        if code < 0:
            name = signal.Signals(-code).name
            hint = " (hard CPU or memory limit, or killed)" if -code == signal.SIGKILL else ""
            return f"killed by {name}{hint}"
        if code > 128:
            name = signal.Signals(code - 128).name if code - 128 in signal.Signals._value2member_map_ else code
            return f"killed by {name}" + (" (hard CPU or memory limit, or killed)" if code == 137 else "")
        return f"exit status {code}"

    def kill(self) -> None:
        """Kill the interpreter and everything it started; keeps the working directory."""
        if self._proc is None:
            return
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except OSError:
            pass
        if self._cgroup:
            self._cgroup.kill_all()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        """Stop the interpreter and delete its working directory and cgroup."""
        if self._proc is not None:
            if self._proc.stdin:
                try:
                    self._proc.stdin.close()
                except OSError:
                    pass
            self.kill()
            if self._drains:
                for drain in self._drains:
                    drain.close()
            for stream in (self._proc.stdout, self._proc.stderr):
                if stream:
                    stream.close()
            self._proc = None
        if self._resp_fd >= 0:
            os.close(self._resp_fd)
            self._resp_fd = -1
        if self._cgroup:
            self._cgroup.remove()
            self._cgroup = None
        if self._workdir:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass


def isolation_gaps(report: Mapping[str, object]) -> list[str]:
    """The confinement layers a sandbox's isolation ``report`` lacks, as ``"layer: what is in force"`` lines (empty
    when every layer is in force: namespaces with no network, Landlock, no capabilities, a process cap that binds)."""
    gaps = []
    namespaces = str(report.get("namespaces", "not used (SandboxConfig.namespaces=False)"))
    if not namespaces.startswith("net"):
        gaps.append(f"namespaces: {namespaces}")
    network = str(report.get("network", ""))
    if not network.startswith("isolated"):
        gaps.append(f"network: {network}")
    filesystem = str(report.get("filesystem", "unknown"))
    if not filesystem.startswith("Landlock ABI"):
        gaps.append(f"filesystem: {filesystem}")
    if report.get("capabilities") != "none":
        gaps.append(f"capabilities: {report.get('capabilities', 'unknown')}")
    processes = str(report.get("processes", "unknown"))
    if processes.startswith("unlimited") or (report.get("uid") == 0 and not processes.startswith("cgroup")):
        gaps.append(f"processes: {processes}")
    return gaps


def _warn_once(gaps: list[str]) -> None:
    """Log the isolation gaps of this machine's sandboxes once per process (each sandbox start would repeat it)."""
    if gaps and tuple(gaps) not in _WARNED_GAPS:
        _WARNED_GAPS.add(tuple(gaps))
        log.warning("model-written code runs with weaker isolation than full here: %s", "; ".join(gaps))


@atexit.register
def _close_live_sandboxes() -> None:
    """At interpreter exit, stop sandboxes nobody closed (their directories and cgroups go too)."""
    for box in list(_LIVE):
        box.close()


def run_python(code: str, config: SandboxConfig | None = None) -> ExecResult:
    """One-shot: run ``code`` in a fresh sandbox, then delete it."""
    with Sandbox(config) as box:
        return box.run(code)
