"""A Dask worker preload for the heal tests (tests/test_grpo_flow.py, tests/test_collect_flow.py): the rollout
worker's process is killed (SIGKILL, as the kernel's OOM killer or a lost node would) when it is first asked to roll
out version ``LLMRL_TEST_FAULT_VERSION`` (default 1). "First": the file named by ``LLMRL_TEST_FAULT_MARKER`` records
that it happened, so the workers of the run's next attempt live."""

from __future__ import annotations

from typing import Any


def dask_setup(worker: Any) -> None:
    """Dask's preload hook: patch the rollout actor's rollout in this worker process."""
    import os
    import signal
    from pathlib import Path

    from runtime.rollout_actor import RolloutWorker

    rollout = RolloutWorker.rollout
    marker = Path(os.environ["LLMRL_TEST_FAULT_MARKER"])
    fault_version = int(os.environ.get("LLMRL_TEST_FAULT_VERSION", "1"))

    def die_once_at_the_fault_version(self: RolloutWorker, rows: list, version: int, *args: Any, **kwargs: Any) -> dict:
        if version == fault_version and not marker.exists():
            marker.write_text(f"rollout worker {os.getpid()} killed at version {version}\n")
            os.kill(os.getpid(), signal.SIGKILL)
        return rollout(self, rows, version, *args, **kwargs)

    RolloutWorker.rollout = die_once_at_the_fault_version
