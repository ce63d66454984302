"""One flow per run at a time (storage/run_lock.py): a second flow on a running run id is refused at once, naming
the holder; the lock goes with its process however that ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from storage.run_lock import RunBusyError, RunLock

HOLD = """
import sys, time
from storage.run_lock import RunLock
with RunLock(sys.argv[1], "r1"):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_second_holder_is_refused_with_the_first_ones_pid(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunBusyError, match=rf"run 'r1' is already running \(pid {holder.pid} on .+, since "):
            with RunLock(tmp_path, "r1"):
                pass
    finally:
        holder.kill()  # like kill -9: the kernel releases the lock with the process
        holder.wait()
    with RunLock(tmp_path, "r1") as lock:
        assert f'"pid": {os.getpid()}' in lock.path.read_text()
    with RunLock(tmp_path, "r1"):  # released on leaving the block
        pass


def test_a_killed_holders_lock_is_listed_and_cleaned_by_doctor(tmp_path, monkeypatch):
    """A lock left by a killed flow names a holder nobody holds: `llmrl doctor` lists it (with the shared-memory
    weights of a dead trainer) and `--clean` removes both; a lock left by a clean exit, or held, is not listed."""
    from typer.testing import CliRunner

    import storage.guardian
    from llmrl_cli.main import app
    from storage.run_lock import stale_locks

    runs = tmp_path / "runs"
    with RunLock(runs / "done", "done"):
        pass
    assert (runs / "done" / "state" / "run.lock").read_text() == ""  # a clean exit leaves no holder named
    killed = subprocess.Popen([sys.executable, "-c", HOLD, str(runs / "killed")], stdout=subprocess.PIPE, text=True)
    held = subprocess.Popen([sys.executable, "-c", HOLD, str(runs / "held")], stdout=subprocess.PIPE, text=True)
    try:
        assert killed.stdout.readline().strip() == "held" and held.stdout.readline().strip() == "held"
        killed.kill()
        killed.wait()
        stale = runs / "killed" / "state" / "run.lock"
        deadline = time.monotonic() + 10
        while stale.read_text() and time.monotonic() < deadline:  # the killed holder's guardian empties it
            time.sleep(0.1)
        assert stale.read_text() == ""
        # what a guardian cannot clean (the host rebooted, the guardian was killed too): the file names the holder
        stale.write_text(json.dumps({"pid": killed.pid, "host": "h", "started": "2026-12-08 00:00:00"}))
        assert stale_locks(runs) == [stale]
        shm = tmp_path / "shm"
        orphan = shm / f"llmrl-handoff-{killed.pid}"  # the dead process's pid: a trainer that is gone
        orphan.mkdir(parents=True)
        (orphan / "weights.bin").write_bytes(b"x" * 2**20)
        (shm / f"llmrl-handoff-{os.getpid()}").mkdir()  # a live trainer's: kept
        monkeypatch.setattr(storage.guardian, "SHARED_MEMORY", shm)
        monkeypatch.setenv("LLMRL_RUNS_DIR", str(runs))
        listed = CliRunner().invoke(app, ["doctor", "--skip-engine"])
        assert "leftovers     1 shared-memory weight folder(s) of dead trainers (1 MiB), 1 stale run lock(s)" in (
            listed.output
        ), listed.output
        assert str(orphan) in listed.output and str(stale) in listed.output and orphan.exists() and stale.exists()
        cleaned = CliRunner().invoke(app, ["doctor", "--skip-engine", "--clean"])
        assert "removed" in cleaned.output and not orphan.exists() and not stale.exists()
        assert (shm / f"llmrl-handoff-{os.getpid()}").exists() and (runs / "held" / "state" / "run.lock").exists()
        again = CliRunner().invoke(app, ["doctor", "--skip-engine"])
        assert "leftovers     none" in again.output, again.output
    finally:
        held.kill()
        held.wait()


def test_the_grpo_flow_refuses_a_run_that_is_running(tmp_path):
    from flows.grpo import grpo

    run_dir = tmp_path / "runs" / "busy"
    with RunLock(run_dir, "busy"):
        start = time.monotonic()
        with pytest.raises(RunBusyError, match="run 'busy' is already running"):
            grpo(overrides=["run_id=busy", f"runs_dir={tmp_path / 'runs'}", "iterations=1"])
        assert time.monotonic() - start < 60  # refused before any worker or engine started
    assert not (tmp_path / "runs" / "mlflow.db").exists()  # nothing recorded for the refused flow
    assert not (run_dir / "checkpoints").exists()


KILLED_WITH_A_TRAINER = """
import os, subprocess, sys, time
from pathlib import Path
from storage.run_lock import RunLock
with RunLock(sys.argv[1], "r1"):
    trainer = subprocess.Popen(["sleep", "60"])  # stands in for the flow's trainer worker
    folder = Path("/dev/shm") / f"llmrl-handoff-{trainer.pid}"
    folder.mkdir()
    (folder / "engine-weights.safetensors").write_bytes(b"x" * 2**20)
    print(folder, flush=True)
    time.sleep(60)
"""


@pytest.mark.skipif(not os.access("/dev/shm", os.W_OK), reason="needs a writable /dev/shm (Linux)")
def test_a_flow_killed_with_its_process_group_is_cleaned_up_within_seconds(tmp_path):
    """SIGKILL to the flow's whole process group (flow and trainer): its guardian, in a session of its own, empties
    the lock file and removes the trainer's shared-memory folder within seconds (issue 71: they stayed until the
    next run on the host)."""
    flow = subprocess.Popen(
        [sys.executable, "-c", KILLED_WITH_A_TRAINER, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    folder = Path(flow.stdout.readline().strip())
    lock = tmp_path / "state" / "run.lock"
    try:
        assert folder.is_dir() and f'"pid": {flow.pid}' in lock.read_text()
    finally:
        os.killpg(flow.pid, signal.SIGKILL)
        flow.wait()
    killed_at = time.monotonic()
    while (folder.exists() or lock.read_text()) and time.monotonic() - killed_at < 10:
        time.sleep(0.1)
    assert not folder.exists() and lock.read_text() == "", "the guardian did not clean up within 10 s"
    print(f"cleaned {time.monotonic() - killed_at:.1f} s after the kill")


def test_a_flow_that_ends_leaves_no_guardian_behind(tmp_path):
    with RunLock(tmp_path, "r1") as lock:
        guardian = lock._guardian
        assert guardian is not None and guardian.poll() is None  # watching while the flow runs
    assert guardian.poll() is not None and lock.path.read_text() == ""
