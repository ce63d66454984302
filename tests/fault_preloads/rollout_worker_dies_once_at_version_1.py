"""A Dask worker preload for tests/test_grpo_flow.py: the rollout worker's process is killed (SIGKILL, as the kernel's
OOM killer or a lost node would) when it is first asked to roll out version 1. "First": the file named by
``LLMRL_TEST_FAULT_MARKER`` records that it happened, so the workers of the run's next attempt live."""

from __future__ import annotations

from typing import Any


def dask_setup(worker: Any) -> None:
    """Dask's preload hook: patch the rollout actor's rollout in this worker process."""
    import os
    import signal
    from pathlib import Path

    from tasks.rollout_actor import RolloutWorker

    rollout = RolloutWorker.rollout
    marker = Path(os.environ["LLMRL_TEST_FAULT_MARKER"])

    def die_once_at_version_1(self: RolloutWorker, rows: list, version: int, *args: Any, **kwargs: Any) -> dict:
        if version == 1 and not marker.exists():
            marker.write_text(f"rollout worker {os.getpid()} killed at version 1\n")
            os.kill(os.getpid(), signal.SIGKILL)
        return rollout(self, rows, version, *args, **kwargs)

    RolloutWorker.rollout = die_once_at_version_1
