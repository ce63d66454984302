"""A Dask worker preload for tests/test_multinode.py: the trainer's whole node is lost (SIGKILL to the worker's
process group: its nanny and the worker process, as a lost machine would be) when the trainer is first asked to
train version ``LLMRL_TEST_FAULT_VERSION``. "First": the file named by ``LLMRL_TEST_FAULT_MARKER`` records that it
happened; the test then starts a replacement node with the same resources."""

from __future__ import annotations

from typing import Any


def dask_setup(worker: Any) -> None:
    """Dask's preload hook: patch the trainer actor's train in this worker process."""
    import os
    import signal
    from pathlib import Path

    from runtime.trainer_actor import TrainerWorker

    train = TrainerWorker.train
    marker = Path(os.environ["LLMRL_TEST_FAULT_MARKER"])
    fault_version = int(os.environ["LLMRL_TEST_FAULT_VERSION"])

    def lose_the_node_once(self: TrainerWorker, store_uri: str, version: int, *args: Any, **kwargs: Any) -> dict:
        if version == fault_version and not marker.exists():
            marker.write_text(f"trainer node {os.getpgid(0)} lost while asked to train version {version}\n")
            os.killpg(os.getpgid(0), signal.SIGKILL)
        return train(self, store_uri, version, *args, **kwargs)

    TrainerWorker.train = lose_the_node_once
