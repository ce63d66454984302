"""Where the stages run: a Dask cluster with rollout workers and one trainer worker.

By default a ``LocalCluster`` with ``rollout.workers + 1`` worker processes is started for the flow run
(the first ``rollout.workers`` host engines, the last hosts the trainer). With ``dask.address`` the flow
joins an existing scheduler; its workers say what they host through Dask resources: ``ROLLOUT`` for
engine workers, ``TRAINER`` (or ``GPU``) for the trainer, e.g.
``dask worker tcp://host:8786 --resources "GPU=1"``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmrl_core.pipeline.grpo_config import GRPOConfig


@dataclass
class Placement:
    """The client and which worker addresses host the rollout engines and the trainer."""

    client: Any
    rollout: list[str]
    trainer: str


def place_workers(workers: dict[str, dict], n_rollout: int, declared: bool) -> tuple[list[str], str]:
    """Choose rollout and trainer workers from ``scheduler_info()["workers"]``."""
    addresses = sorted(workers)
    if len(addresses) < 2:
        raise RuntimeError(f"need at least 2 Dask workers (rollout + trainer), found {len(addresses)}")
    if not declared:
        if len(addresses) < n_rollout + 1:
            raise RuntimeError(f"need {n_rollout + 1} workers for {n_rollout} rollout workers + 1 trainer")
        return addresses[:n_rollout], addresses[-1]
    trainers = [a for a in addresses if {"GPU", "TRAINER"} & set(workers[a].get("resources", {}))]
    rollout = [a for a in addresses if "ROLLOUT" in workers[a].get("resources", {}) and a not in trainers[:1]]
    if not trainers or not rollout:
        raise RuntimeError(
            "the Dask workers must declare resources: ROLLOUT for engine workers and TRAINER or GPU for the "
            f"trainer; found {[(a, workers[a].get('resources', {})) for a in addresses]}"
        )
    return rollout[:n_rollout], trainers[0]


@contextmanager
def dask_cluster(cfg: GRPOConfig, scratch: Path) -> Iterator[Placement]:
    """Open the cluster for one flow run and close what this function started when it ends."""
    from dask.distributed import Client, LocalCluster

    if cfg.dask.address:
        with Client(cfg.dask.address) as client:
            rollout, trainer = place_workers(client.scheduler_info()["workers"], cfg.rollout.workers, True)
            yield Placement(client, rollout, trainer)
        return
    scratch.mkdir(parents=True, exist_ok=True)
    with (
        LocalCluster(
            n_workers=cfg.rollout.workers + 1,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            host="127.0.0.1",
            # Engines and the trainer are long-lived actors, not Dask data: Dask's memory manager would pause
            # or restart them (losing the resident state) when a training step peaks; let the OS decide.
            memory_limit=0,
            local_directory=cfg.dask.local_directory or str(scratch),
        ) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(cfg.rollout.workers + 1, timeout=120)
        rollout, trainer = place_workers(client.scheduler_info()["workers"], cfg.rollout.workers, False)
        yield Placement(client, rollout, trainer)
