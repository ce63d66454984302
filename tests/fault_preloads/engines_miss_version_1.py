"""A Dask worker preload for tests/test_grpo_flow.py: every rollout engine reports version 1 without loading it
(it keeps serving version 0), as a weight update that never reaches the engine would."""

from __future__ import annotations

from typing import Any


def dask_setup(worker: Any) -> None:
    """Dask's preload hook: patch the rollout actor's load in this worker process."""
    from runtime.rollout_actor import RolloutWorker

    load = RolloutWorker.load

    def load_but_miss_version_1(self: RolloutWorker, checkpoint_path: str, version: int) -> int:
        if version == 1:
            self.worker.policy_version = version  # claims version 1, holds version 0
            return version
        return load(self, checkpoint_path, version)

    RolloutWorker.load = load_but_miss_version_1
