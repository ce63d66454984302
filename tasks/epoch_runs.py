"""What the SFT and offline flows share: a resident trainer run for ``epochs`` passes over one training set.

    open the run (layout, lineage, checkpoints, resume point) -> the flow prepares and records its data
    -> trainer-only Dask cluster -> resident trainer -> version 0 (a new run) or restore the last version
    -> per epoch: train, metrics, publish version e+1 (checkpoint + optimizer/RNG state, lineage, commit)
    -> summary

Version 0 is the starting model. A version counts once its commit marker exists; running the same run id
again resumes after the last published epoch, and raising ``epochs`` extends a finished run. Each flow
keeps only what differs: how it builds the training set and what it records about it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import get_run_logger

from llmrl_core.model_store import resolve_model
from llmrl_core.pipeline.offline_config import OfflineConfig
from llmrl_core.pipeline.sft_config import SFTConfig
from runtime.actor_calls import wait_calls
from runtime.cluster import dask_cluster
from runtime.console import progress_bar
from runtime.sft_actor import TrainerSetup, start_trainer
from runtime.trainer_ranks import TrainerRanks
from storage.checkpoints import CheckpointStore
from storage.hashing import config_hash
from storage.layout import RunLayout
from storage.lineage import DataRef, LineageConfig, LineageRecorder
from storage.run_lock import RunLock
from tasks.commits import check_resume_state, fetch_markers, latest_published, replaced_line
from tasks.epoch_stages import lineage_config, train_epoch
from tasks.fork import Fork, resolve_fork, start_from_fork
from tasks.publishing import publish_version
from tasks.run_identity import identify_run

EPOCH_METRICS = ("loss_first", "loss_last", "loss_mean", "steps", "grad_norm", "epoch_s")

EpochConfig = SFTConfig | OfflineConfig


@dataclass
class EpochRun:
    """One flow run of an epoch-trained run: where it lives, what it records to, and where it resumes."""

    cfg: EpochConfig
    layout: RunLayout
    model_path: str
    published: tuple[int, dict] | None  # the last published version and its marker; None for a new run
    config: dict  # the settings that define a version (recorded with each one)
    lineage: LineageRecorder
    checkpoints: CheckpointStore
    lock: RunLock
    fork: Fork | None = None  # a new run's start in another run (init.from); epochs have no data cursor to carry

    @classmethod
    def open(cls, cfg: EpochConfig, pipeline: str) -> EpochRun:
        """Lay out ``cfg``'s run, find its last published version and prepare its lineage (``pipeline`` names
        the flow in MLflow), holding the run's lock (a flow already running it is refused). Enter the run to start
        recording; leaving it releases the lock."""
        layout = RunLayout.for_runs_dir(cfg.run_id, cfg.runs_dir)
        config = lineage_config(cfg)
        lock = RunLock(layout.run_dir, cfg.run_id).__enter__()  # one flow per run at a time: refused if running
        try:
            fetch_markers(layout.run_dir, layout.markers_uri)  # a remote runs_dir: versions another host committed
            published = latest_published(layout.run_dir)
            lineage = LineageRecorder(
                layout.run_dir,
                pipeline=pipeline,
                run_id=cfg.run_id,
                config=config,
                lineage_config=LineageConfig(tracking_uri=cfg.tracking_uri),
                accepted_hashes={config_hash(lineage_config(cfg, keep_where=True))},  # as recorded before WHERE_ONLY
                new_run=published is None,
            )
            if lineage.replaced_run:
                get_run_logger().info(replaced_line(cfg.run_id, lineage.replaced_run))
            checkpoints = CheckpointStore(layout.checkpoints_uri)
            fork = resolve_fork(cfg.run_id, cfg.runs_dir, cfg.init) if published is None else None
            if published is not None and published[0] > 0:  # before any worker: a resume needs its optimizer state
                check_resume_state(layout, published[0], cfg.train.resume_without_state)
            run = cls(cfg, layout, resolve_model(cfg.model), published, config, lineage, checkpoints, lock, fork)
            identify_run(cfg.run_id, run.start, run.final, lineage)  # the Prefect run named after it, UIs linked
        except BaseException:
            lock.__exit__()
            raise
        return run

    def __enter__(self) -> EpochRun:
        """Start recording (the MLflow run); the run's lock is held until the block ends."""
        self.lineage.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.lineage.__exit__(*exc)
        finally:
            self.lock.__exit__()

    @property
    def run_dir(self) -> Path:
        """The run's folder."""
        return self.layout.run_dir

    @property
    def start(self) -> int:
        """The first epoch this flow run trains (the last published version; 0 for a new run)."""
        return self.published[0] if self.published else 0

    @property
    def final(self) -> int:
        """The run's last version once this flow run is done."""
        return max(self.start, self.cfg.epochs)

    def publish(self, trainer: Any, version: int, **records: Any) -> dict[str, Any]:
        """Publish ``version`` of the trainer's weights with its lineage ``records`` (data, metrics) and commit it."""
        return publish_version(
            trainer,
            [],
            version,
            self.config,
            run_id=self.cfg.run_id,
            run_dir=self.run_dir,
            checkpoints=self.checkpoints,
            lineage=self.lineage,
            markers_uri=self.layout.markers_uri,
            **records,
        )

    def summary(self, **details: Any) -> dict[str, Any]:
        """What the flow returns: the run, its final version, the flow's ``details`` and where everything is."""
        return {
            "run_id": self.cfg.run_id,
            "published_version": self.final,
            **details,
            "checkpoints": self.layout.checkpoints_uri,
            "mlflow_tracking_uri": self.lineage.tracking_uri,
            "run_dir": str(self.run_dir),
        }


@dataclass
class EpochPlan:
    """What the trainer runs epochs over, and what each published version records besides its checkpoint."""

    setup: TrainerSetup
    samples: str  # the training-set file
    groups_per_batch: int  # prompt groups (SFT: samples) per mini-batch
    steps_per_batch: int = 1  # optimizer steps per mini-batch
    data: list[DataRef] = field(default_factory=list)  # the lineage data of every trained version
    fixed_metrics: dict[str, float] = field(default_factory=dict)  # recorded with every trained version
    # Metrics measured on the trainer after each epoch. When set, version 0 (the starting model) is measured
    # too and recorded with ``data``; otherwise it is published bare.
    measure: Callable[[Any], dict[str, float]] | None = None
    reported_loss: tuple[str, str] = ("loss", "loss_mean")  # the (label, metric) each epoch's log line names


def log_training_set(lineage: LineageRecorder, data: dict[str, Any], num_rows: int) -> DataRef:
    """Record the prepared training set the trainer reads (``data["samples"]``: a path or URI, and its sha256) as a
    tokenized input of the run."""
    return lineage.log_training_dataset(
        data["samples"], name="samples.parquet", digest=data["samples_sha256"], num_rows=num_rows, context="tokenized"
    )


def train_epochs(run: EpochRun, plan: EpochPlan) -> None:
    """Train the epochs ``run`` still lacks (inside ``run.lineage``), publishing one version per epoch."""
    log = get_run_logger()
    cfg = run.cfg
    if run.published is not None and run.start >= cfg.epochs:
        log.info("run %s already has version %d: nothing to train", cfg.run_id, run.start)
        return
    label, key = plan.reported_loss
    with dask_cluster(cfg, run.run_dir / "dask", rollout_workers=0) as place:
        trainer = start_trainer(place, plan.setup, run.layout)
        if run.fork is not None:
            start_from_fork(TrainerRanks(trainer), run.fork, run.lineage)
            log.info("new run %s, forked from %s", cfg.run_id, run.fork.label)
        if run.published is None and plan.measure is not None:
            metrics = plan.measure(trainer)
            run.publish(trainer, 0, data=plan.data, metrics=metrics)
            log.info("version 0 (starting model) published; %s %.4f", label, metrics[key])
        elif run.published is None:
            run.publish(trainer, 0)
        elif run.start > 0:
            if not wait_calls([(trainer, trainer.restore(run.start))], "resume", run.start)[0]:
                log.warning("version %d resumed from its weights alone: a fresh optimizer", run.start)
        name = "sft" if isinstance(cfg, SFTConfig) else "offline"
        bar = progress_bar(cfg.epochs, f"{name} {cfg.run_id}", "epoch", initial=run.start)  # the console's, as grpo's
        try:
            _train_and_publish(run, plan, trainer, bar)
        finally:
            if bar is not None:
                bar.close()


def _train_and_publish(run: EpochRun, plan: EpochPlan, trainer: Any, bar: Any) -> None:
    """Train and publish each epoch ``run`` still lacks, one version each, moving the console's ``bar``."""
    log = get_run_logger()
    cfg = run.cfg
    label, key = plan.reported_loss
    for epoch in range(run.start, cfg.epochs):
        trained = train_epoch(trainer, plan.samples, epoch, plan.groups_per_batch, plan.steps_per_batch)
        measured = plan.measure(trainer) if plan.measure is not None else {}
        metrics = {**plan.fixed_metrics, **measured, **{k: trained[k] for k in EPOCH_METRICS}}
        info = run.publish(trainer, epoch + 1, data=plan.data, metrics=metrics)
        log.info(
            "epoch %d -> version %d: %d steps, %s %.4f, %.1f s; %s",
            epoch,
            epoch + 1,
            int(metrics["steps"]),
            label,
            metrics[key],
            metrics["epoch_s"],
            info["checkpoint"],
        )
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(f"{label} {metrics[key]:.4f}")
