"""A run on a joined cluster (``dask.address``) waits a while for the workers it needs (a lost worker's replacement
after a restart, or workers started beside the flow), then says what is missing."""

from __future__ import annotations

import time

import pytest

from runtime.cluster import wait_for_placement

ROLLOUT = {"resources": {"ROLLOUT": 1}}
TRAINER = {"resources": {"TRAINER": 1}}


class Scheduler:
    """A client whose scheduler lists the workers of ``views`` in turn (the last one stays)."""

    def __init__(self, *views: dict[str, dict]):
        self.views, self.calls = list(views), 0

    def scheduler_info(self):
        self.calls += 1
        return {"workers": self.views[min(self.calls, len(self.views)) - 1]}


def test_the_run_waits_for_a_replacement_rollout_worker():
    lost = {"tcp://t:1": TRAINER}  # the rollout worker died; its replacement joins at the third look
    back = {"tcp://t:1": TRAINER, "tcp://r2:1": ROLLOUT}
    client = Scheduler(lost, lost, back)
    assert wait_for_placement(client, 1, timeout_s=5, poll_s=0.01) == (["tcp://r2:1"], ["tcp://t:1"])
    assert client.calls == 3


def test_fewer_rollout_workers_than_asked_is_an_error_after_the_wait_not_a_smaller_run():
    client = Scheduler({"tcp://t:1": TRAINER, "tcp://r:1": ROLLOUT, "tcp://x:1": {}})
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"after waiting 0 s .* rollout.workers=2 but the cluster has 1 worker"):
        wait_for_placement(client, 2, timeout_s=0.2, poll_s=0.05)
    assert time.monotonic() - start >= 0.2 and client.calls > 1
    with pytest.raises(RuntimeError, match="must declare resources"):
        wait_for_placement(Scheduler({"tcp://a:1": {}, "tcp://b:1": {}}), 1, timeout_s=0, poll_s=0)


def test_a_trainer_only_run_needs_no_rollout_worker():
    assert wait_for_placement(Scheduler({"tcp://t:1": TRAINER}), 0, timeout_s=0) == ([], ["tcp://t:1"])
