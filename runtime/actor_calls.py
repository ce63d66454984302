"""Waiting on the run's actors without waiting forever: a dead or hung worker is named within seconds.

A Dask actor call's future waits as long as it takes. A worker that died answers with an ``OSError`` from deep in
Dask; a worker that hangs (SIGSTOP, a stalled or partitioned node) is noticed only when the scheduler drops it at
its worker TTL, minutes later. :func:`wait_calls` waits on ``(actor, future)`` pairs in slices of
:data:`PROBE_EVERY_S`; between slices it asks the scheduler when it last heard from each worker it waits on
(every worker sends a heartbeat about every second, also while its actor computes: actors run in their own
thread). It raises :class:`WorkerLost`, one line naming the worker, the stage and the version, when a worker

* is gone from the scheduler (it died: killed, out of memory, its node lost), or
* has been silent for :data:`SILENT_LIMIT_S` (hung), or
* is alive but the stage outlived its deadline: :data:`STAGE_FACTOR` times the longest the same stage took
  before in this process, at least :data:`STAGE_FLOOR_S` (an engine or a trainer stuck in a call).

An error raised by the actor's own code (a reward function, a bad batch) reaches the caller unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

PROBE_EVERY_S = 5.0
SILENT_LIMIT_S = 30.0
STAGE_FLOOR_S = 900.0
STAGE_FACTOR = 5.0
UNREACHABLE = "Unable to contact Actor's worker"  # distributed.actor's OSError when the call's connection fails

_longest_s: dict[str, float] = {}  # stage -> the longest wait seen for it in this process


class WorkerLost(RuntimeError):
    """A worker of the run died or stopped answering while a stage waited on it (the message names the worker,
    its role, the stage and the version)."""


def with_restarts(
    attempt: Callable[[], T], restarts: int, log: Any, again: str = "resuming from the last committed version"
) -> T:
    """``attempt()`` (one attempt at a run: its own workers, resuming after its last committed version), tried again
    after a :class:`WorkerLost` at most ``restarts`` times (``dask.restarts``), each restart named in one line on
    ``log`` (``again`` says where the next attempt starts); the last :class:`WorkerLost` is raised. The healing of
    the GRPO, SFT, offline and collect flows."""
    for restart in range(restarts + 1):
        try:
            return attempt()
        except WorkerLost as lost:
            if restart == restarts:
                raise
            log.warning(
                "%s. Restart %d of %d (dask.restarts): new workers, %s",
                lost,
                restart + 1,
                restarts,
                again,
            )
    raise AssertionError("unreachable")  # the loop returns or raises


def wait_calls(
    calls: Sequence[tuple[Any, Any]], stage: str, version: int | None = None, *, deadline: bool = True
) -> list[Any]:
    """The results of ``(actor, actor future)`` pairs, in order; :class:`WorkerLost` when a worker they run on
    dies or hangs, or when the stage outlives its deadline (see the module docstring). ``deadline=False`` for a
    stage whose length is the user's data size (an SFT epoch over the whole training set): only a dead or silent
    worker ends the wait then."""
    start = time.monotonic()
    limit = max(STAGE_FLOOR_S, STAGE_FACTOR * _longest_s.get(stage, 0.0)) if deadline else float("inf")
    deadline_at = start + limit
    results = []
    for actor, future in calls:
        while True:
            try:
                results.append(future.result(timeout=PROBE_EVERY_S))
                break
            except TimeoutError:
                _check_worker(actor, stage, version)
                if time.monotonic() > deadline_at:
                    raise WorkerLost(
                        f"{_who(actor)} has not finished {_what(stage, version)} after "
                        f"{time.monotonic() - start:.0f} s (its deadline: {STAGE_FACTOR:g}x the longest {stage} "
                        f"so far, at least {STAGE_FLOOR_S:.0f} s); the worker answers, its actor does not"
                    ) from None
            except OSError as exc:  # what Dask raises when it cannot reach the actor's worker (or the actor's own)
                # Dask's own words for a failed connection; the scheduler may not have noticed the death yet
                if str(exc) == UNREACHABLE or _silence(actor) is None:
                    raise WorkerLost(f"{_who(actor)} died during {_what(stage, version)} ({exc})") from exc
                raise
    _longest_s[stage] = max(_longest_s.get(stage, 0.0), time.monotonic() - start)
    return results


def _check_worker(actor: Any, stage: str, version: int | None) -> None:
    """:class:`WorkerLost` if ``actor``'s worker is gone or silent past :data:`SILENT_LIMIT_S`."""
    silent = _silence(actor)
    if silent is None:
        raise WorkerLost(f"{_who(actor)} died during {_what(stage, version)} (the scheduler no longer has it)")
    if silent > SILENT_LIMIT_S:
        raise WorkerLost(
            f"{_who(actor)} stopped answering during {_what(stage, version)}: no heartbeat for {silent:.0f} s "
            "(hung, stopped or cut off from the scheduler)"
        )


def _silence(actor: Any) -> float | None:
    """Seconds since the scheduler last heard from ``actor``'s worker; None when the scheduler no longer has it."""
    from distributed import get_client

    address = actor._address

    def seconds_silent(dask_scheduler: Any) -> float | None:
        ws = dask_scheduler.workers.get(address)
        return None if ws is None else time.time() - ws.last_seen

    return get_client().run_on_scheduler(seconds_silent)


def _who(actor: Any) -> str:
    """``"the rollout worker tcp://..."`` from the actor's class and address."""
    role = {"RolloutWorker": "rollout", "TrainerWorker": "trainer", "EpochTrainerWorker": "trainer"}.get(
        actor._cls.__name__, actor._cls.__name__
    )
    return f"the {role} worker {actor._address}"


def _what(stage: str, version: int | None) -> str:
    return stage if version is None else f"{stage} of version {version}"
