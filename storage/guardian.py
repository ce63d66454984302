"""What a killed flow leaves on its host is cleaned within seconds by a small process that outlives it.

A flow that ends in any way but SIGKILL releases its run lock and its trainer's shared-memory weights itself. After
a SIGKILL nothing of it runs again: its lock file still names it (the kernel releases the ``flock``, not the text)
and the folder its trainer kept under ``/dev/shm`` (``llmrl-handoff-<trainer pid>``, hundreds of MB) holds memory
until someone removes it. :class:`~storage.run_lock.RunLock` therefore starts a guardian (:func:`start_guardian`,
this module run as ``python -m storage.guardian``) in a session of its own, so a kill of the flow's process group
does not reach it. It checks every :data:`POLL_S` seconds whether the flow is alive: once the flow has released its
lock it ends; once the flow is gone it clears the lock file if nobody holds it, removes the handoff folders whose
process is gone (for :data:`LINGER_S` seconds, while the flow's workers end), and ends. It imports nothing
heavier than the standard library. ``llmrl doctor --clean`` removes what a guardian could not (a host that
rebooted, a guardian that was killed too).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

SHARED_MEMORY = Path("/dev/shm")
PREFIX = "llmrl-handoff-"
POLL_S = 0.25  # how often the guardian looks at the flow
LINGER_S = 15.0  # after the flow's death: how long orphaned handoff folders are swept (its workers end meanwhile)


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (someone else's counts; a zombie, killed but not yet reaped by its
    parent, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):  # no /proc (not Linux): the signal's answer stands
        return True
    return state != "Z"


def orphaned_folders(root: Path | None = None) -> list[Path]:
    """The handoff folders under ``root`` (default ``/dev/shm``) whose trainer process no longer exists."""
    root = SHARED_MEMORY if root is None else root
    return sorted(
        folder
        for folder in root.glob(f"{PREFIX}*")
        if (pid := folder.name.removeprefix(PREFIX)).isdigit() and not alive(int(pid))
    )


def sweep_orphans(root: Path | None = None) -> list[Path]:
    """Remove the handoff folders under ``root`` (default ``/dev/shm``) whose trainer process no longer exists;
    returns them."""
    removed = orphaned_folders(root)
    for folder in removed:
        shutil.rmtree(folder, ignore_errors=True)
    return removed


def _names(lock_path: Path, pid: int) -> bool:
    """Whether the lock file names ``pid`` as its holder."""
    try:
        return json.loads(lock_path.read_text() or "{}").get("pid") == pid
    except (OSError, ValueError, AttributeError):
        return False


def clear_lock(lock_path: Path, pid: int) -> bool:
    """Empty the lock file if it still names ``pid`` and nobody holds its lock (taken while it is emptied); returns
    whether it was emptied."""
    try:
        handle = open(lock_path, "r+", encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError:
        return False
    with handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a live flow holds it (a new run on the same id)
            return False
        try:
            if not _names(lock_path, pid):
                return False
            handle.truncate(0)
            return True
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def guard(pid: int, lock_path: Path, handoff_root: Path = SHARED_MEMORY, linger_s: float = LINGER_S) -> str:
    """Watch flow ``pid`` (see the module docstring); returns how it ended: ``released`` or ``cleaned``."""
    while alive(pid):
        if not _names(lock_path, pid):
            return "released"
        time.sleep(POLL_S)
    clear_lock(lock_path, pid)
    until = time.monotonic() + linger_s
    while True:
        sweep_orphans(handoff_root)
        if time.monotonic() >= until:
            return "cleaned"
        time.sleep(0.5)


def start_guardian(lock_path: Path, handoff_root: Path = SHARED_MEMORY) -> subprocess.Popen | None:
    """Start the guardian of this process's run lock ``lock_path`` in a session of its own; None where it cannot
    start (the flow then runs unguarded: ``llmrl doctor --clean`` remains)."""
    command = [sys.executable, "-m", "storage.guardian", "--pid", str(os.getpid()), "--lock", str(lock_path)]
    command += ["--handoff-root", str(handoff_root)]
    try:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            cwd=Path(__file__).resolve().parents[1],
        )
    except OSError:
        return None


def main() -> None:
    """``python -m storage.guardian --pid P --lock PATH [--handoff-root DIR]``."""
    parser = argparse.ArgumentParser(description="Clean up after flow P once it is gone (see storage/guardian.py).")
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--lock", type=Path, required=True)
    parser.add_argument("--handoff-root", type=Path, default=SHARED_MEMORY)
    args = parser.parse_args()
    guard(args.pid, args.lock, args.handoff_root)


if __name__ == "__main__":
    main()
