"""The stages every resident-trainer epoch run shares (SFT and offline GRPO), as thin Prefect tasks.

A run of either flow trains a :class:`~runtime.sft_actor.EpochTrainerWorker` for ``epochs`` passes over one
training-set file; these tasks call it, and :func:`lineage_config` says which settings define its versions.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from prefect import task

from llmrl_core.pipeline.offline_config import OfflineConfig
from llmrl_core.pipeline.sft_config import SFTConfig
from runtime.actor_calls import wait_calls
from tasks.grpo_stages import STAGE, version_defining


@task(name="evaluate-loss", **STAGE)
def evaluate_loss(trainer: Any, samples_path: str) -> dict[str, float]:
    """The objective on the whole training set without gradients (on the trainer worker)."""
    return wait_calls([(trainer, trainer.evaluate(samples_path))], "evaluation", deadline=False)[0]


@task(name="train-epoch", **STAGE)
def train_epoch(trainer: Any, samples_path: str, epoch: int, groups_per_batch: int, steps_per_batch: int = 1) -> dict:
    """One epoch of optimizer steps over the training set (on the trainer worker)."""
    call = trainer.train_epoch(samples_path, epoch, groups_per_batch, steps_per_batch)
    return wait_calls([(trainer, call)], "training", epoch + 1, deadline=False)[0]  # the version it makes


def lineage_config(cfg: SFTConfig | OfflineConfig, keep_where: bool = False) -> dict:
    """The settings that define what a version is (the run length ``epochs`` excluded, so a run can be extended;
    where its files go excluded, as for GRPO: :data:`tasks.grpo_stages.WHERE_ONLY`)."""
    data = asdict(cfg)
    data.pop("epochs")
    return version_defining(data, keep_where)
