"""A Dask worker preload for tests/test_sft_flow.py: the trainer worker's process is killed (SIGKILL, as the kernel's
OOM killer or a lost node would) when it is first asked to train epoch 1 (the pass that makes version 2). "First":
the file named by ``LLMRL_TEST_FAULT_MARKER`` records that it happened, so the workers of the next attempt live."""

from __future__ import annotations

from typing import Any


def dask_setup(worker: Any) -> None:
    """Dask's preload hook: patch the epoch trainer's train_epoch in this worker process."""
    import os
    import signal
    from pathlib import Path

    from runtime.sft_actor import EpochTrainerWorker

    train_epoch = EpochTrainerWorker.train_epoch
    marker = Path(os.environ["LLMRL_TEST_FAULT_MARKER"])

    def die_once_at_epoch_1(self: EpochTrainerWorker, samples_path: str, epoch: int, *args: Any, **kwargs: Any) -> dict:
        if epoch == 1 and not marker.exists():
            marker.write_text(f"trainer worker {os.getpid()} killed at epoch 1\n")
            os.kill(os.getpid(), signal.SIGKILL)
        return train_epoch(self, samples_path, epoch, *args, **kwargs)

    EpochTrainerWorker.train_epoch = die_once_at_epoch_1
