"""One flow at a time per run: an exclusive lock on the run folder while a flow writes it.

Two ``llmrl run grpo`` with the same run id would otherwise both run over one folder (and one MLflow run), the
last writer winning. The lock is ``fcntl.flock`` on ``<run>/state/run.lock``: the kernel releases it when its
process ends, however it ends (no stale lock after a crash or ``kill -9``), and the file names its holder (pid,
host, start time), so a second flow is refused at once with who holds it. A guardian process empties the file
within seconds of a SIGKILL of its holder (:mod:`storage.guardian`). It guards the flow host's run folder:
flows on different hosts writing one remote ``runs_dir`` are not serialised by it.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from storage.guardian import start_guardian


class RunBusyError(RuntimeError):
    """Another flow holds the run's lock."""


class RunLock:
    """``with RunLock(run_dir, run_id):`` holds the run's lock for the block (see the module docstring)."""

    def __init__(self, run_dir: str | os.PathLike[str], run_id: str) -> None:
        self.path = Path(run_dir) / "state" / "run.lock"
        self.run_id = run_id
        self._file: Any = None
        self._guardian: Any = None

    def __enter__(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 - held until __exit__
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read()
            handle.close()
            raise _busy(self.run_id, holder) from None
        handle.seek(0)
        handle.truncate()
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": started}))
        handle.flush()
        self._file = handle
        self._guardian = start_guardian(self.path)  # cleans up after a SIGKILL of this process
        return self

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:
            self._file.truncate(0)  # no holder: a file that still names one was left by a killed flow
            self._file.flush()
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None
        if self._guardian is not None:  # it would see the lock released and end by itself: no need to wait
            self._guardian.terminate()
            self._guardian.wait()
            self._guardian = None


def check_not_busy(run_dir: str | os.PathLike[str], run_id: str) -> None:
    """Raise :class:`RunBusyError` when a flow holds run ``run_id``'s lock now (a check before anything starts; it
    creates nothing: a run without a lock file is free)."""
    try:
        handle = open(Path(run_dir) / "state" / "run.lock", encoding="utf-8")  # noqa: SIM115 - closed below
    except (FileNotFoundError, NotADirectoryError):
        return
    with handle:
        if _held(handle):
            raise _busy(run_id, handle.read())


def stale_locks(runs_root: str | os.PathLike[str]) -> list[Path]:
    """The run locks under ``runs_root`` that name a holder but are not held: left by a flow that was killed
    (SIGKILL ends the lock, not the file). They stop nothing; ``llmrl doctor --clean`` removes them."""
    stale = []
    for path in sorted(Path(runs_root).glob("*/state/run.lock")):
        try:
            with open(path, encoding="utf-8") as handle:
                if handle.read().strip() and not _held(handle):  # a holder named, none holding it
                    stale.append(path)
        except OSError:
            continue
    return stale


def _held(handle: Any) -> bool:
    """Whether another process holds the lock of the open lock file ``handle`` (tested without taking it)."""
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    return False


def _busy(run_id: str, lock_text: str) -> RunBusyError:
    return RunBusyError(
        f"run {run_id!r} is already running ({_holder(lock_text)}); wait for it to finish, stop it, or give another "
        "run_id"
    )


def _holder(text: str) -> str:
    try:
        info = json.loads(text)
        return f"pid {info['pid']} on {info['host']}, since {info['started']}"
    except (ValueError, KeyError, TypeError):
        return "held by another process"
