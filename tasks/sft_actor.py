"""A resident trainer that runs epochs over a prepared training set (SFT and offline GRPO), and where it runs.

:class:`EpochTrainerWorker` is a :class:`~tasks.trainer_actor.TrainerWorker` (same checkpoint, optimizer-state and
RNG publishing and restoring, so the SFT and offline flows resume exactly as GRPO does) whose objective is
chosen by a small :class:`TrainerSetup` -- ``SFTLoss`` or ``GRPOLoss`` -- and whose data is a training-set
file (:mod:`tasks.train_data`) read by path or URI and cached on the worker. :func:`start_trainer` places it on the
trainer worker of :func:`tasks.cluster.dask_cluster` (a trainer-only cluster, ``rollout_workers=0``).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from llmrl_core.pipeline.offline_config import OfflineConfig
from llmrl_core.pipeline.sft_config import SFTConfig
from storage.checkpoints import CheckpointStore
from storage.layout import RunLayout
from tasks.cluster import Placement
from tasks.train_data import epoch_batches, read_samples, samples_fingerprint
from tasks.trainer_actor import TrainerWorker


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

    @classmethod
    def for_run(
        cls,
        cfg: SFTConfig | OfflineConfig,
        objective: Literal["sft", "grpo"],
        loss_options: dict[str, Any],
        ref_model: bool,
    ) -> TrainerSetup:
        """The setup of ``cfg``'s run: its run, model, seed and checkpoints, and its ``train`` section's optimizer."""
        t = cfg.train
        return cls(
            run_id=cfg.run_id,
            model=cfg.model,
            objective=objective,
            loss_options=loss_options,
            ref_model=ref_model,
            seed=cfg.seed,
            keep_checkpoints=cfg.keep_checkpoints,
            lr=t.lr,
            max_grad_norm=t.max_grad_norm,
            token_budget=t.token_budget,
            mixed_precision=t.mixed_precision,
            threads=t.threads,
            device=t.device,
        )


class EpochTrainerWorker(TrainerWorker):
    """The policy model, an SFT or GRPO objective and its optimizer, resident on a Dask worker."""

    def __init__(self, setup: TrainerSetup, layout: RunLayout) -> None:
        """``layout``: where the run's checkpoints and trainer states live (local folders, or URIs of a store every
        node reaches: a remote ``runs_dir``). The model (``setup.model``) is resolved here, on this worker."""
        from transformers import AutoModelForCausalLM

        from llmrl_core.model_store import resolve_model
        from llmrl_core.objectives import GRPOLoss, SFTLoss
        from llmrl_core.trainer import Trainer, TrainerConfig

        torch.set_num_threads(setup.threads or os.cpu_count() or 1)
        cuda = setup.device == "cuda" or (setup.device == "auto" and torch.cuda.is_available())
        self.cfg = setup  # TrainerWorker.publish reads cfg.model
        self.layout = layout
        model_path = resolve_model(setup.model)
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
        self.checkpoints = CheckpointStore(self.layout.checkpoints_uri, keep_last=setup.keep_checkpoints)
        self._cache: tuple[tuple[str, int | None, int | None], tuple[list[Any], list[str]]] | None = None

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
