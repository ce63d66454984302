"""Where the stages run: a Dask cluster with rollout workers and one trainer worker (GRPO, collect), or the
trainer worker alone (SFT and offline GRPO, which make no rollouts: ``rollout_workers=0``).

Placement is by Dask resources in both cases: ``ROLLOUT`` workers host the engines, the worker declaring
``TRAINER`` (or ``GPU``) hosts the trainer.

* By default a local cluster (a ``SpecCluster`` of nanny processes on 127.0.0.1) is started for the flow
  run: ``rollout.workers`` workers with ``ROLLOUT=1`` and one trainer worker with ``TRAINER=1``, plus
  ``GPU=1`` when the trainer runs on CUDA (``train.device`` cuda, or auto with a GPU present).
* With ``dask.address`` the flow joins an existing scheduler whose workers declare the same resources,
  e.g. ``dask worker tcp://host:8786 --resources "GPU=1"``; a trainer-only run also accepts a scheduler
  with a single, undeclared worker.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmrl_core.pipeline.grpo_config import GRPOConfig
from llmrl_core.pipeline.offline_config import OfflineConfig
from llmrl_core.pipeline.sft_config import SFTConfig

RunConfig = GRPOConfig | SFTConfig | OfflineConfig  # the configs with ``dask`` and ``train.device`` sections


@dataclass
class Placement:
    """The client and which worker addresses host the rollout engines and the trainer."""

    client: Any
    rollout: list[str]
    trainer: str


def place_workers(workers: dict[str, dict], n_rollout: int) -> tuple[list[str], str]:
    """Choose rollout and trainer workers from ``scheduler_info()["workers"]`` by their declared resources."""
    if n_rollout == 0:
        return [], trainer_worker(workers)
    addresses = sorted(workers)
    if len(addresses) < 2:
        raise RuntimeError(f"need at least 2 Dask workers (rollout + trainer), found {len(addresses)}")
    trainers = [a for a in addresses if {"GPU", "TRAINER"} & set(workers[a].get("resources", {}))]
    rollout = [a for a in addresses if "ROLLOUT" in workers[a].get("resources", {}) and a not in trainers[:1]]
    if not trainers or not rollout:
        raise RuntimeError(
            "the Dask workers must declare resources: ROLLOUT for engine workers and TRAINER or GPU for the "
            f"trainer; found {[(a, workers[a].get('resources', {})) for a in addresses]}"
        )
    return rollout[:n_rollout], trainers[0]


def trainer_worker(workers: dict[str, dict]) -> str:
    """The trainer of a run without rollouts: the worker declaring ``TRAINER`` or ``GPU``, else the only one."""
    declared = sorted(a for a, w in workers.items() if {"GPU", "TRAINER"} & set(w.get("resources", {})))
    if declared:
        return declared[0]
    if len(workers) == 1:
        return next(iter(workers))
    raise RuntimeError(
        "several Dask workers and none declares a TRAINER or GPU resource; start the trainer worker with "
        f"--resources 'TRAINER=1' (found {sorted(workers)})"
    )


def trainer_on_gpu(cfg: RunConfig) -> bool:
    """Whether the trainer will run on CUDA (``train.device`` cuda, or auto with a visible GPU)."""
    if cfg.train.device == "cuda":
        return True
    if cfg.train.device != "auto":
        return False
    import torch

    return torch.cuda.is_available()


def rollout_count(cfg: RunConfig, rollout_workers: int | None) -> int:
    """How many rollout workers the run uses: ``rollout_workers`` when given, else ``cfg.rollout.workers``."""
    if rollout_workers is not None:
        return rollout_workers
    if not isinstance(cfg, GRPOConfig):
        raise TypeError(f"{type(cfg).__name__} has no rollout section: pass rollout_workers (0 for a trainer only)")
    return cfg.rollout.workers


def local_worker_resources(cfg: RunConfig, rollout_workers: int | None = None) -> dict[str, dict[str, float]]:
    """Worker name -> Dask resources of the local cluster: the rollout workers, then the trainer."""
    n_rollout = rollout_count(cfg, rollout_workers)
    specs: dict[str, dict[str, float]] = {f"rollout-{i}": {"ROLLOUT": 1} for i in range(n_rollout)}
    specs["trainer"] = {"TRAINER": 1, **({"GPU": 1} if trainer_on_gpu(cfg) else {})}
    return specs


@contextmanager
def dask_cluster(cfg: RunConfig, scratch: Path, rollout_workers: int | None = None) -> Iterator[Placement]:
    """Open the cluster for one flow run and close what this function started when it ends.

    ``rollout_workers``: how many engine workers (default ``cfg.rollout.workers``; 0: the trainer alone).
    """
    from dask.distributed import Client, Nanny, Scheduler, SpecCluster

    n_rollout = rollout_count(cfg, rollout_workers)
    if cfg.dask.address:
        with Client(cfg.dask.address) as client:
            rollout, trainer = place_workers(client.scheduler_info()["workers"], n_rollout)
            yield Placement(client, rollout, trainer)
        return
    scratch.mkdir(parents=True, exist_ok=True)
    common = dict(
        nthreads=1,
        host="127.0.0.1",
        # Engines and the trainer are long-lived actors, not Dask data: Dask's memory manager would pause
        # or restart them (losing the resident state) when a training step peaks; let the OS decide.
        memory_limit=0,
        local_directory=cfg.dask.local_directory or str(scratch),
    )
    resources = local_worker_resources(cfg, n_rollout)
    workers = {name: {"cls": Nanny, "options": {**common, "resources": res}} for name, res in resources.items()}
    scheduler = {"cls": Scheduler, "options": {"host": "127.0.0.1", "dashboard_address": None}}
    with (
        SpecCluster(workers=workers, scheduler=scheduler, name="llmrl-grpo") as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(len(workers), timeout=120)
        rollout, trainer = place_workers(client.scheduler_info()["workers"], n_rollout)
        yield Placement(client, rollout, trainer)
