"""A resident trainer that runs epochs over a prepared training set (SFT and offline GRPO), and where it runs.

:class:`EpochTrainerWorker` is a :class:`~tasks.actors.TrainerWorker` (same checkpoint, optimizer-state and
RNG publishing and restoring, so the SFT and offline flows resume exactly as GRPO does) whose objective is
chosen by a small :class:`TrainerSetup` -- ``SFTLoss`` or ``GRPOLoss`` -- and whose data is a training-set
file (:mod:`tasks.train_data`) read by path and cached on the worker. :func:`trainer_cluster` places it: a
one-worker ``LocalCluster`` by default, or the ``TRAINER`` / ``GPU`` worker of an existing scheduler.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from llmrl_core.pipeline.grpo_config import DaskConfig
from storage.checkpoints import CheckpointStore
from storage.layout import RunLayout
from tasks.actors import TrainerWorker
from tasks.train_data import epoch_batches, read_samples


@dataclass
class TrainerSetup:
    """What the resident trainer needs: run, model, objective (``sft`` | ``grpo``) and optimizer settings."""

    run_id: str
    model: str
    objective: Literal["sft", "grpo"]
    loss_options: dict[str, Any] = field(default_factory=dict)
    ref_model: bool = False  # keep a frozen copy of the starting weights (KL to the reference)
    seed: int = 0
    keep_checkpoints: int = 3
    lr: float = 1e-5
    max_grad_norm: float = 1.0
    token_budget: int = 2048
    mixed_precision: str = "auto"
    threads: int = 0
    device: str = "auto"


class EpochTrainerWorker(TrainerWorker):
    """The policy model, an SFT or GRPO objective and its optimizer, resident on a Dask worker."""

    def __init__(self, setup: TrainerSetup, model_path: str, runs_root: str) -> None:
        from transformers import AutoModelForCausalLM

        from llmrl_core.objectives import GRPOLoss, SFTLoss
        from llmrl_core.trainer import Trainer, TrainerConfig

        torch.set_num_threads(setup.threads or os.cpu_count() or 1)
        cuda = setup.device == "cuda" or (setup.device == "auto" and torch.cuda.is_available())
        self.cfg = setup  # TrainerWorker.publish reads cfg.model
        self.layout = RunLayout(setup.run_id, Path(runs_root))
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to("cuda" if cuda else "cpu")
        self.ref = copy.deepcopy(self.model).eval().requires_grad_(False) if setup.ref_model else None
        objective = {"sft": SFTLoss, "grpo": GRPOLoss}[setup.objective]
        self.trainer = Trainer(
            objective(self.model, **setup.loss_options),
            TrainerConfig(
                lr=setup.lr,
                max_grad_norm=setup.max_grad_norm,
                token_budget=setup.token_budget,
                mixed_precision=setup.mixed_precision,  # type: ignore[arg-type]
                seed=setup.seed,
            ),
        )
        self.checkpoints = CheckpointStore(self.layout.checkpoints_dir, keep_last=setup.keep_checkpoints)
        self._cache: tuple[tuple[str, int], tuple[list[Any], list[str]]] | None = None

    def _data(self, path: str) -> tuple[list[Any], list[str]]:
        key = (path, os.stat(path).st_mtime_ns)
        if self._cache is None or self._cache[0] != key:
            samples, groups = read_samples(path)
            if self.ref is not None:
                samples = [self._with_ref(s) for s in samples]
            self._cache = (key, (samples, groups))
        return self._cache[1]

    @torch.no_grad()
    def _with_ref(self, sample: Any) -> Any:
        from llmrl_core.trainer.batch import pack_samples
        from llmrl_core.trainer.scoring import score_packed

        if sample.ref_logprobs is not None:
            return sample
        device = next(self.ref.parameters()).device
        scores = score_packed(self.ref, pack_samples([sample]).to(device))
        return dataclasses.replace(sample, ref_logprobs=scores.log_probs[0, : len(sample.response_ids)].cpu().tolist())

    def evaluate(self, samples_path: str) -> dict[str, float]:
        """The objective's metrics on the whole training set, without gradients (e.g. the SFT loss)."""
        samples, _ = self._data(samples_path)
        return self.trainer.evaluate(samples)

    def train_epoch(self, samples_path: str, epoch: int, groups_per_batch: int, steps_per_batch: int = 1) -> dict:
        """One pass over the training set: seeded mini-batches of whole groups, ``steps_per_batch`` steps each."""
        start = time.perf_counter()
        samples, groups = self._data(samples_path)
        losses, last = [], {}
        for rows in epoch_batches(groups, groups_per_batch, self.cfg.seed, epoch):
            batch = [samples[i] for i in rows]
            for _ in range(steps_per_batch):
                last = self.trainer.train_step(batch)
                losses.append(last["loss"])
        numeric = {k: float(v) for k, v in last.items() if isinstance(v, int | float)}
        return {
            **numeric,
            "loss_first": losses[0],
            "loss_last": losses[-1],
            "loss_mean": float(np.mean(losses)),
            "steps": float(len(losses)),
            "samples": float(len(samples)),
            "epoch_s": time.perf_counter() - start,
        }


@dataclass
class TrainerPlacement:
    """The Dask client and the worker that hosts the trainer."""

    client: Any
    trainer: str


def pick_trainer(workers: dict[str, dict]) -> str:
    """The worker declaring ``TRAINER`` or ``GPU`` (the only worker when there is one)."""
    declared = sorted(a for a, w in workers.items() if {"GPU", "TRAINER"} & set(w.get("resources", {})))
    if declared:
        return declared[0]
    if len(workers) == 1:
        return next(iter(workers))
    raise RuntimeError(
        "several Dask workers and none declares a TRAINER or GPU resource; start the trainer worker with "
        f"--resources 'TRAINER=1' (found {sorted(workers)})"
    )


@contextmanager
def trainer_cluster(dask: DaskConfig, scratch: Path) -> Iterator[TrainerPlacement]:
    """A one-worker LocalCluster for the flow run (or an existing scheduler when ``dask.address`` is set)."""
    from dask.distributed import Client, LocalCluster

    if dask.address:
        with Client(dask.address) as client:
            yield TrainerPlacement(client, pick_trainer(client.scheduler_info()["workers"]))
        return
    scratch.mkdir(parents=True, exist_ok=True)
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            host="127.0.0.1",
            memory_limit=0,  # the resident trainer is not Dask data: never pause or restart it
            local_directory=dask.local_directory or str(scratch),
        ) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(1, timeout=120)
        yield TrainerPlacement(client, pick_trainer(client.scheduler_info()["workers"]))


def start_trainer(place: TrainerPlacement, setup: TrainerSetup, model_path: str, runs_root: str) -> Any:
    """Create the resident trainer actor on the trainer worker; returns the actor handle."""
    future = place.client.submit(
        EpochTrainerWorker, setup, model_path, runs_root, actor=True, workers=[place.trainer], pure=False
    )
    return future.result()
