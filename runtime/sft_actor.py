"""A resident trainer that runs epochs over a prepared training set (SFT and offline GRPO), and where it runs.

:class:`EpochTrainerWorker` is a :class:`~runtime.trainer_actor.TrainerWorker` (same checkpoint, optimizer-state and
RNG publishing and restoring, so the SFT and offline flows resume exactly as GRPO does) whose objective is
chosen by a small :class:`TrainerSetup` -- ``SFTLoss`` or ``GRPOLoss`` -- and whose data is a training-set
file (:mod:`runtime.train_data`) read by path or URI and cached on the worker. :func:`start_trainer` places it on the
trainer worker of :func:`runtime.cluster.dask_cluster` (a trainer-only cluster, ``rollout_workers=0``).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from llmrl_core.pipeline.offline_config import OfflineConfig
from llmrl_core.pipeline.sft_config import SFTConfig
from runtime.cluster import Placement
from runtime.train_data import epoch_batches, read_samples, samples_fingerprint
from runtime.trainer_actor import TrainerWorker
from storage.layout import RunLayout


@dataclass
class TrainerSetup:
    """What the resident trainer needs: run, model, objective (``sft`` | ``grpo``), checkpoints and the run's
    ``train`` section (optimizer, precision, LoRA, gradient checkpointing, threads, device)."""

    run_id: str
    model: str
    objective: Literal["sft", "grpo"]
    train: Any  # the run's train section (SFTTrainConfig, or the offline run's TrainConfig)
    loss_options: dict[str, Any] = field(default_factory=dict)
    ref_model: bool = False  # keep a frozen copy of the starting weights (KL to the reference)
    seed: int = 0
    keep_checkpoints: int = 3
    keep_every: int | None = None
    progress: bool = False

    @classmethod
    def for_run(
        cls,
        cfg: SFTConfig | OfflineConfig,
        objective: Literal["sft", "grpo"],
        loss_options: dict[str, Any],
        ref_model: bool,
    ) -> TrainerSetup:
        """The setup of ``cfg``'s run: its run, model, seed, checkpoints and ``train`` section."""
        return cls(
            run_id=cfg.run_id,
            model=cfg.model,
            objective=objective,
            train=cfg.train,
            loss_options=loss_options,
            ref_model=ref_model,
            seed=cfg.seed,
            keep_checkpoints=cfg.keep_checkpoints,
        )


class EpochTrainerWorker(TrainerWorker):
    """The policy model, an SFT or GRPO objective and its optimizer, resident on a Dask worker."""

    def __init__(self, setup: TrainerSetup, layout: RunLayout) -> None:
        """``layout``: where the run's checkpoints and trainer states live (local folders, or URIs of a store every
        node reaches: a remote ``runs_dir``). Built as every trainer is (:class:`TrainerWorker`), with the
        objective and reference model of ``setup``; the model (``setup.model``) is resolved here, on this worker."""
        super().__init__(setup, setup.model, layout)
        self._cache: tuple[tuple[str, int | None, int | None], tuple[list[Any], list[str]]] | None = None

    def _objective(self, model: torch.nn.Module) -> Any:
        from llmrl_core.objectives import GRPOLoss, SFTLoss

        objective = {"sft": SFTLoss, "grpo": GRPOLoss}[self.cfg.objective]
        return objective(model, **self.cfg.loss_options)

    def _keeps_reference(self) -> bool:
        return self.cfg.ref_model

    def _data(self, path: str) -> tuple[list[Any], list[str]]:
        key = samples_fingerprint(path)
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


def start_trainer(place: Placement, setup: TrainerSetup, layout: RunLayout) -> Any:
    """Create the resident trainer actor on the trainer worker; returns the actor handle."""
    return place.start_actor(EpochTrainerWorker, setup, layout, worker=place.trainer).result()
