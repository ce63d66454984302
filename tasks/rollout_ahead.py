"""Rollouts sent ahead of training: the GRPO flow's queue of in-flight batches.

With ``rollout.max_staleness = k`` the flow keeps ``k`` batches in flight: while the trainer trains batch ``v``
(sampled by version ``max(0, v - k)``), the engines sample batch ``v + k`` with version ``v``. ``k = 0`` is the
synchronous loop: each batch is sent and awaited in its own iteration.

Everything a batch depends on is fixed by its index — the prompts (the data cursor advances batch by batch),
the sampling seeds and the version that samples it — so a resume re-sends the unpublished batches and gets the
same rows; the engines are given the right checkpoint before each batch is sent.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llmrl_core.pipeline.grpo_config import GRPOConfig
from runtime.weight_sync import EngineActorsUpdater
from storage.checkpoints import CheckpointStore
from storage.trajectories import TrajectoryStore
from tasks import grpo_stages as stages


@dataclass
class InFlight:
    """A batch sent to the engines: ``(engine, call)`` pairs, the data cursor after it, when it was sent."""

    batch: stages.Batch
    calls: list[tuple[Any, Any]]
    primer_state: dict
    sent_at: float


@dataclass
class Arrived:
    """A batch whose rollouts are staged: the shards' summaries and how long the trainer waited for them."""

    batch: stages.Batch
    shards: list[dict]
    primer_state: dict
    wait_s: float


class RolloutAhead:
    """Sends batches to the rollout engines in index order and hands them to the trainer when they are staged.

    ``engine_version`` is the version the engines hold now; the flow reports each publish with
    :meth:`published` (publishing loads the new weights into every engine).
    """

    def __init__(
        self,
        cfg: GRPOConfig,
        staging_uri: str,
        engines: Sequence[Any],
        checkpoints: CheckpointStore,
        engine_version: int,
        primer_state: dict | None,
    ) -> None:
        self.cfg = cfg
        self.staging_uri = staging_uri
        self.engines = list(engines)
        self.checkpoints = checkpoints
        self.engine_version = engine_version
        self.cursor = primer_state
        self.in_flight: dict[int, InFlight] = {}

    def published(self, version: int) -> None:
        """The engines now hold ``version`` (the publish step loaded it)."""
        self.engine_version = version

    def fill(self, start: int) -> None:
        """Send the batches that must be in flight before training version ``start``: ``start`` .. ``start + k - 1``
        (none in a synchronous run)."""
        for index in range(start, min(start + self.cfg.rollout.max_staleness, self.cfg.iterations)):
            self.send(index)

    def send(self, index: int) -> None:
        """Send batch ``index`` to the engines (after loading the version that samples it, when they hold another)."""
        if index in self.in_flight or index >= self.cfg.iterations:
            return
        batch = stages.batch_of(self.cfg, self.staging_uri, index)
        if self.engine_version != batch.policy_version:
            path = str(self.checkpoints.weights_path(batch.policy_version))
            EngineActorsUpdater(self.engines, stage="weight loading").push_version(batch.policy_version, path)
            self.engine_version = batch.policy_version
        TrajectoryStore(batch.staging_uri).delete_partition(self.cfg.run_id, batch.policy_version)
        rows, cursor = stages.load_prompts(self.cfg, self.cursor)
        self.cursor = cursor
        calls = stages.dispatch_rollout(self.engines, rows, batch.policy_version, batch.staging_uri, batch=batch.index)
        self.in_flight[index] = InFlight(batch, calls, cursor, time.perf_counter())

    def take(self, index: int) -> Arrived:
        """Wait for batch ``index`` (sending it first if it is not in flight yet) and return its summaries."""
        if index not in self.in_flight:
            self.send(index)
        flight = self.in_flight.pop(index)
        start = time.perf_counter()
        shards = stages.await_rollout(flight.calls, flight.batch.policy_version)
        return Arrived(flight.batch, shards, flight.primer_state, time.perf_counter() - start)
