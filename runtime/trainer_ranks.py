"""The trainer's data-parallel ranks (``train.data_parallel > 1``): rank 0 is the run's trainer actor, which the flow
talks to for everything (reference scoring, publishing, the weight route); ranks 1.. are trainer actors on workers of
their own that only join the group, restore what rank 0 restores and train beside it.

The ranks form a ``torch.distributed`` group through a TCP rendezvous on rank 0's host (gloo on CPU, NCCL on CUDA:
:meth:`runtime.trainer_actor.TrainerWorker.join_data_parallel`); every train step is collective, so each call the flow
makes that changes the weights goes to all ranks at once and waits for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from runtime.actor_calls import wait_calls


@dataclass
class TrainerRanks:
    """Rank 0 (``lead``, the flow's trainer actor) and the other ranks' actors (``others``, empty: one trainer)."""

    lead: Any
    others: list[Any] = field(default_factory=list)

    @property
    def all(self) -> list[Any]:
        """Every rank's actor, rank 0 first."""
        return [self.lead, *self.others]

    def join(self, lead_address: str) -> str:
        """Form the group (blocks until every rank joined); returns its log line. No-op for one trainer."""
        if not self.others:
            return ""
        host = urlsplit(lead_address).hostname or "127.0.0.1"
        port = wait_calls([(self.lead, self.lead.weight_group_port())], "start-up")[0]
        world = len(self.all)
        joined = wait_calls(
            [(t, t.join_data_parallel(f"tcp://{host}:{port}", rank, world)) for rank, t in enumerate(self.all)],
            "start-up",
        )
        return (
            f"training data-parallel over {world} trainer ranks ({joined[0]['backend']}, rendezvous {host}:{port}; "
            "train.data_parallel): each trains on its token-balanced shard of the batch, gradients summed"
        )

    def call_all(self, method: str, *args: Any, stage: str, version: int | None = None) -> Any:
        """``method(*args)`` on every rank at once; returns rank 0's result once all of them returned. Ranks 1..
        are waited for first: a rank whose worker died leaves the others blocked in a collective, and waiting on
        it is what names it (:class:`~runtime.actor_calls.WorkerLost`, so the run restarts from its last version)."""
        calls = [(t, getattr(t, method)(*args)) for t in self.all]
        return wait_calls([*calls[1:], calls[0]], stage, version)[-1]
