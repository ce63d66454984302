"""Flow ``sft``: supervised fine-tuning from a chat dataset or from a run's best stored responses.

    data: chats (jsonl / parquet / GSM8K) -> tokenize with assistant-only masks
       or stored trajectories -> TopKRewardSelector (rejection sampling) -> their stored tokens and masks
    -> training set (one Parquet file) -> resident trainer (SFTLoss) on a Dask worker
    -> per epoch: train, loss on the training set, publish version e+1 (checkpoint + optimizer/RNG state),
       lineage (MLflow, pipeline "sft"), commit

Version 0 is the starting model. Like GRPO, a version counts once its commit marker exists, and running the
same run id again resumes after the last published epoch (weights, optimizer and RNG restored; each epoch's
batch order depends only on (seed, epoch)). Raising ``epochs`` extends a finished run.
Run it with ``llmrl run sft [--config x.yaml] [--set section.key=value ...]``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from llmrl_core.model_store import resolve_model
from llmrl_core.pipeline.config_io import load_config
from llmrl_core.pipeline.preflight import preflight
from llmrl_core.pipeline.sft_config import SFTConfig
from storage.checkpoints import CheckpointStore
from storage.layout import RunLayout, default_runs_root
from storage.lineage import DataRef, LineageConfig, LineageRecorder
from storage.trajectories import TrajectoryStore
from tasks import sft_stages as stages
from tasks.grpo_stages import latest_published
from tasks.publishing import publish_version, version_history
from tasks.sft_actor import start_trainer, trainer_cluster

EPOCH_METRICS = ("loss_first", "loss_last", "loss_mean", "steps", "grad_norm", "epoch_s")


def log_data(cfg: SFTConfig, data: dict[str, Any], lineage: LineageRecorder, store_uri: str) -> list[DataRef]:
    """Record what is trained on: the dataset (or source and selected partitions) and the tokenized file."""
    if cfg.source == "dataset":
        refs = [lineage.log_training_dataset(data["source"], num_rows=data["rows"])]
    else:
        run = cfg.trajectories.run_id
        source, selected = TrajectoryStore(store_uri), TrajectoryStore(data["selected_store"])
        for v in data["versions"]:
            lineage.log_trajectory_partition(source, v["version"], run_id=run, context="source")
        refs = [
            lineage.log_trajectory_partition(selected, v["version"], run_id=run, context="training")
            for v in data["versions"]
            if v["selected"]
        ]
    refs.append(lineage.log_training_dataset(data["samples"], num_rows=data["rows"], context="tokenized"))
    return refs


@flow(name="sft")
def sft(config: str | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """Run (or resume) SFT: ``config`` is a YAML file, ``overrides`` are ``section.key=value`` strings."""
    log = get_run_logger()
    cfg = load_config(SFTConfig, config, overrides or [])
    preflight(cfg)  # before any task, cluster, engine or write
    layout = RunLayout(cfg.run_id, Path(cfg.runs_dir) if cfg.runs_dir else default_runs_root())
    run_dir = layout.run_dir
    model_path = resolve_model(cfg.model)
    published = latest_published(run_dir)
    start = published[0] if published else 0
    config_dict = stages.lineage_config(cfg)
    lineage = LineageRecorder(
        run_dir,
        pipeline="sft",
        run_id=cfg.run_id,
        config=config_dict,
        lineage_config=LineageConfig(tracking_uri=cfg.tracking_uri),
    )
    checkpoints = CheckpointStore(layout.checkpoints_dir)
    published_to = dict(run_id=cfg.run_id, run_dir=run_dir, checkpoints=checkpoints, lineage=lineage)
    store_uri = cfg.trajectories.store or layout.trajectories_uri
    with lineage:
        if cfg.source == "dataset":
            data = stages.prepare_dataset(cfg, model_path, run_dir)
        else:
            data = stages.select_trajectories(cfg, store_uri, run_dir)
        refs = log_data(cfg, data, lineage, store_uri)
        samples = data["samples"]
        log.info(
            "run %s: %d training samples (%s); epochs %d..%d", cfg.run_id, data["rows"], samples, start, cfg.epochs
        )
        if published is not None and start >= cfg.epochs:
            log.info("run %s already has version %d: nothing to train", cfg.run_id, start)
        else:
            with trainer_cluster(cfg.dask, run_dir / "dask") as place:
                trainer = start_trainer(place, stages.trainer_setup(cfg), model_path, str(layout.runs_root))
                if published is None:
                    metrics = {"data_loss": stages.evaluate_loss(trainer, samples)["loss"]}
                    publish_version(trainer, [], 0, config_dict, data=refs, metrics=metrics, **published_to)
                    log.info(
                        "version 0 (starting model) published; loss on the training set %.4f", metrics["data_loss"]
                    )
                elif start > 0:
                    trainer.restore(start).result()
                for epoch in range(start, cfg.epochs):
                    trained = stages.train_epoch(trainer, samples, epoch, cfg.train.batch_size)
                    data_loss = stages.evaluate_loss(trainer, samples)["loss"]
                    metrics = {"data_loss": data_loss, **{k: trained[k] for k in EPOCH_METRICS}}
                    info = publish_version(
                        trainer, [], epoch + 1, config_dict, data=refs, metrics=metrics, **published_to
                    )
                    log.info(
                        "epoch %d -> version %d: %d steps, loss on the training set %.4f, %.1f s; %s",
                        epoch,
                        epoch + 1,
                        int(metrics["steps"]),
                        metrics["data_loss"],
                        metrics["epoch_s"],
                        info["checkpoint"],
                    )
    final = max(start, cfg.epochs)
    summary = {
        "run_id": cfg.run_id,
        "published_version": final,
        "samples": samples,
        "data_loss": {row["version"]: row.get("data_loss") for row in version_history(run_dir, final)},
        "checkpoints": str(layout.checkpoints_dir),
        "mlflow_tracking_uri": lineage.tracking_uri,
        "run_dir": str(run_dir),
    }
    log.info("done: %s", summary)
    return summary


if __name__ == "__main__":
    sft()
