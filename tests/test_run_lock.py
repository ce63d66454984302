"""One flow per run at a time (storage/run_lock.py): a second flow on a running run id is refused at once, naming
the holder; the lock goes with its process however that ends."""

from __future__ import annotations

import os
import subprocess
import sys
import time

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
