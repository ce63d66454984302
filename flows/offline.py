"""Flow ``offline``: GRPO from a run's stored trajectories -- no new rollouts -- into a new run.

    source partitions (run, chosen versions) -> re-score (optional: rescore.reward) -> advantages (mc_advantage
    per prompt group) -> re-scored partitions + training set -> resident GRPO trainer on a Dask worker
    -> per epoch: mini-batches of whole groups, publish version e+1, lineage (MLflow, pipeline "offline"), commit

The importance ratio of ``GRPOLoss`` compares the trained policy with the stored sampler log-probs, so the
clip keeps each step close to the policy that generated the data. Version 0 is the starting model
(``model``); the same run id resumes after its last published epoch, exactly as the SFT and GRPO flows.
Run it with ``llmrl run offline --set source.run_id=R --set rescore.reward=gsm8k_strict``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from flows.sft import EPOCH_METRICS
from llmrl_core.model_store import resolve_model
from llmrl_core.pipeline.config_io import load_config
from llmrl_core.pipeline.offline_config import OfflineConfig
from llmrl_core.pipeline.preflight import preflight
from storage.checkpoints import CheckpointStore
from storage.layout import RunLayout, default_runs_root
from storage.lineage import LineageConfig, LineageRecorder
from storage.trajectories import TrajectoryStore
from tasks import offline_stages as stages
from tasks.grpo_stages import latest_published
from tasks.publishing import publish_version
from tasks.sft_actor import start_trainer, trainer_cluster
from tasks.sft_stages import lineage_config, train_epoch


@flow(name="offline")
def offline(config: str | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """Run (or resume) offline GRPO: ``config`` is a YAML file, ``overrides`` are ``section.key=value`` strings."""
    log = get_run_logger()
    cfg = load_config(OfflineConfig, config, overrides or [])
    preflight(cfg)  # before any task, cluster, engine or write
    layout = RunLayout(cfg.run_id, Path(cfg.runs_dir) if cfg.runs_dir else default_runs_root())
    run_dir = layout.run_dir
    model_path = resolve_model(cfg.model)
    published = latest_published(run_dir)
    start = published[0] if published else 0
    config_dict = lineage_config(cfg)
    lineage = LineageRecorder(
        run_dir,
        pipeline="offline",
        run_id=cfg.run_id,
        config=config_dict,
        lineage_config=LineageConfig(tracking_uri=cfg.tracking_uri),
    )
    checkpoints = CheckpointStore(layout.checkpoints_dir)
    published_to = dict(run_id=cfg.run_id, run_dir=run_dir, checkpoints=checkpoints, lineage=lineage)
    store_uri = cfg.source.store or layout.trajectories_uri
    src = cfg.source.run_id
    with lineage:
        data = stages.rescore(cfg, store_uri, run_dir)
        source, rescored = TrajectoryStore(store_uri), TrajectoryStore(data["rescored_store"])
        for version in data["versions"]:
            lineage.log_trajectory_partition(source, version, run_id=src, context="source")
        refs = [lineage.log_trajectory_partition(rescored, v, run_id=src) for v in data["versions"]]
        refs.append(lineage.log_training_dataset(data["samples"], num_rows=data["trained_rows"], context="tokenized"))
        log.info(
            "run %s from %s versions %s: reward %s, mean %.3f -> %.3f (%d changed); %d of %d rows have signal",
            cfg.run_id,
            src,
            data["versions"],
            cfg.rescore.reward,
            data["stored_reward_mean"],
            data["reward_mean"],
            data["changed_rewards"],
            data["trained_rows"],
            data["rows"],
        )
        data_metrics = {k: float(data[k]) for k in ("reward_mean", "stored_reward_mean", "changed_rewards")}
        if published is not None and start >= cfg.epochs:
            log.info("run %s already has version %d: nothing to train", cfg.run_id, start)
        else:
            with trainer_cluster(cfg.dask, run_dir / "dask") as place:
                trainer = start_trainer(place, stages.trainer_setup(cfg), model_path, str(layout.runs_root))
                if published is None:
                    publish_version(trainer, [], 0, config_dict, **published_to)
                elif start > 0:
                    trainer.restore(start).result()
                for epoch in range(start, cfg.epochs):
                    trained = train_epoch(
                        trainer, data["samples"], epoch, cfg.groups_per_step, cfg.train.steps_per_iteration
                    )
                    metrics = {**data_metrics, **{k: trained[k] for k in EPOCH_METRICS}}
                    info = publish_version(
                        trainer, [], epoch + 1, config_dict, data=refs, metrics=metrics, **published_to
                    )
                    log.info(
                        "epoch %d -> version %d: %d steps, loss %.4f, %.1f s; %s",
                        epoch,
                        epoch + 1,
                        int(metrics["steps"]),
                        metrics["loss_mean"],
                        metrics["epoch_s"],
                        info["checkpoint"],
                    )
    summary = {
        "run_id": cfg.run_id,
        "source_run_id": src,
        "published_version": max(start, cfg.epochs),
        **{k: data[k] for k in ("versions", "rows", "trained_rows", "reward_mean", "stored_reward_mean")},
        "rescored": data["rescored_store"],
        "samples": data["samples"],
        "checkpoints": str(layout.checkpoints_dir),
        "mlflow_tracking_uri": lineage.tracking_uri,
        "run_dir": str(run_dir),
    }
    log.info("done: %s", summary)
    return summary


if __name__ == "__main__":
    offline()
