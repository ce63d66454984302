"""A Dask worker preload for tests/test_grpo_flow.py: the rollout worker's whole process stops (SIGSTOP, as a hung
or frozen node would) when it is asked to roll out version ``LLMRL_TEST_HANG_VERSION`` (default 1)."""

from __future__ import annotations

from typing import Any


def dask_setup(worker: Any) -> None:
    """Dask's preload hook: patch the rollout actor's rollout in this worker process."""
    import os
    import signal

    from runtime.rollout_actor import RolloutWorker

    rollout = RolloutWorker.rollout
    hang_version = int(os.environ.get("LLMRL_TEST_HANG_VERSION", "1"))

    def hang_at_the_version(self: RolloutWorker, rows: list, version: int, *args: Any, **kwargs: Any) -> dict:
        if version == hang_version:
            os.kill(os.getpid(), signal.SIGSTOP)  # the worker process, its event loop included, stops here
        return rollout(self, rows, version, *args, **kwargs)

    RolloutWorker.rollout = hang_at_the_version
