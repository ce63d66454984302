"""runtime/actor_calls.py: waiting on actor calls names a dead or hung worker, and leaves the actor's own errors alone.
The scheduler's view of each worker (seconds since its last heartbeat, None when gone) is stood in for here; the
flow test (tests/test_grpo_flow.py, a SIGSTOPped rollout worker) runs the real thing."""

from __future__ import annotations

import pytest

from runtime import actor_calls
from runtime.actor_calls import WorkerLost, wait_calls


class RolloutWorker:  # the name the message gives the worker's role from
    pass


class Actor:
    _cls = RolloutWorker
    _address = "tcp://10.0.0.7:4000"


class Pending:
    """A call that is never done (each wait times out), or that fails with ``error``, or returns ``value``."""

    def __init__(self, value=None, error: BaseException | None = None, never: bool = False):
        self.value, self.error, self.never, self.waits = value, error, never, 0

    def result(self, timeout=None):
        self.waits += 1
        if self.never:
            raise TimeoutError
        if self.error is not None:
            raise self.error
        return self.value


@pytest.fixture
def scheduler(monkeypatch):
    """The scheduler's answer about the worker: seconds silent (None: it no longer has the worker)."""
    view = {"silent": 0.0}
    monkeypatch.setattr(actor_calls, "_silence", lambda actor: view["silent"])
    monkeypatch.setattr(actor_calls, "PROBE_EVERY_S", 0.0)
    monkeypatch.setattr(actor_calls, "_longest_s", {})
    return view


def test_results_come_back_in_order_and_the_stage_time_is_remembered(scheduler):
    assert wait_calls([(Actor(), Pending(1)), (Actor(), Pending(2))], "rollout", 3) == [1, 2]
    assert "rollout" in actor_calls._longest_s


def test_a_silent_worker_is_named_with_the_stage_and_version(scheduler):
    call = Pending(never=True)
    scheduler["silent"] = actor_calls.SILENT_LIMIT_S + 1
    with pytest.raises(WorkerLost, match=r"^the rollout worker tcp://10.0.0.7:4000 stopped answering during "
                       r"rollout of version 3: no heartbeat for 31 s"):  # fmt: skip
        wait_calls([(Actor(), call)], "rollout", 3)
    assert call.waits == 1  # named at the first probe that finds it silent


def test_a_worker_gone_from_the_scheduler_died(scheduler):
    scheduler["silent"] = None
    with pytest.raises(WorkerLost, match=r"the rollout worker .* died during training of version 2 \(the scheduler"):
        wait_calls([(Actor(), Pending(never=True))], "training", 2)
    with pytest.raises(WorkerLost, match=r"died during rollout \(Unable to contact Actor's worker\)") as caught:
        wait_calls([(Actor(), Pending(error=OSError("Unable to contact Actor's worker")))], "rollout")
    assert isinstance(caught.value.__cause__, OSError)


def test_an_unreachable_worker_is_lost_before_the_scheduler_notices(scheduler):
    """A killed worker's connection fails at once; the scheduler drops it seconds later. Dask's words for the failed
    connection name the worker lost even while the scheduler still lists it (the race a CI run hit)."""
    scheduler["silent"] = 0.5  # still listed, heard from half a second ago
    with pytest.raises(WorkerLost, match=r"died during rollout of version 1 \(Unable to contact Actor's worker\)"):
        wait_calls([(Actor(), Pending(error=OSError(actor_calls.UNREACHABLE)))], "rollout", 1)


def test_the_actors_own_errors_reach_the_caller_unchanged(scheduler):
    with pytest.raises(ValueError, match="bad batch"):
        wait_calls([(Actor(), Pending(error=ValueError("bad batch")))], "training", 1)
    with pytest.raises(OSError, match="disk full"):  # an OSError while the worker lives is the actor's own
        wait_calls([(Actor(), Pending(error=OSError("disk full")))], "training", 1)


def test_a_live_worker_whose_call_outlives_the_stage_deadline(scheduler, monkeypatch):
    monkeypatch.setattr(actor_calls, "STAGE_FLOOR_S", 0.05)
    call = Pending(never=True)
    with pytest.raises(WorkerLost, match=r"has not finished weight publishing of version 4 after .* the worker "
                       r"answers, its actor does not"):  # fmt: skip
        wait_calls([(Actor(), call)], "weight publishing", 4)
    assert call.waits > 1  # it kept waiting while the worker answered


def test_the_deadline_follows_the_longest_time_seen(scheduler, monkeypatch):
    monkeypatch.setattr(actor_calls, "STAGE_FLOOR_S", 0.0)
    monkeypatch.setattr(actor_calls, "_longest_s", {"rollout": 0.2})
    import time

    start = time.monotonic()
    with pytest.raises(WorkerLost, match="has not finished"):
        wait_calls([(Actor(), Pending(never=True))], "rollout", 1)
    assert time.monotonic() - start >= actor_calls.STAGE_FACTOR * 0.2 - 0.01


def test_a_stage_without_deadline_waits_while_the_worker_answers(scheduler, monkeypatch):
    """An SFT epoch lasts as long as its data: past the stage floor it still waits while the worker heartbeats, and
    is named lost once the worker falls silent."""
    monkeypatch.setattr(actor_calls, "STAGE_FLOOR_S", 0.0)

    class SlowThenSilent(Pending):
        def result(self, timeout=None):
            self.waits += 1
            if self.waits == 20:
                scheduler["silent"] = actor_calls.SILENT_LIMIT_S + 1
            raise TimeoutError

    call = SlowThenSilent()
    with pytest.raises(WorkerLost, match="stopped answering during training epoch of version 3"):
        wait_calls([(Actor(), call)], "training epoch", 3, deadline=False)
    assert call.waits == 20  # 19 probes past the (zero) floor with the worker answering
