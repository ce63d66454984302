"""Flow ``sft``: supervised fine-tuning from a chat dataset or from a run's best stored responses.

    data: chats (jsonl / parquet / GSM8K) -> tokenize with assistant-only masks
       or stored trajectories -> TopKRewardSelector (rejection sampling) -> their stored tokens and masks
    -> training set (one Parquet file) -> resident trainer (SFTLoss) on a Dask worker
    -> per epoch: train, loss on the training set, publish version e+1 (checkpoint + optimizer/RNG state),
       lineage (MLflow, pipeline "sft"), commit

Version 0 is the starting model. Like GRPO, a version counts once its commit marker exists, and running the
same run id again resumes after the last published epoch (weights, optimizer and RNG restored; each epoch's
batch order depends only on (seed, epoch)). Raising ``epochs`` extends a finished run. The epoch loop is
:mod:`flows.epoch_runs`, shared with the offline flow.
Run it with ``llmrl run sft [--config x.yaml] [--set section.key=value ...]``.
"""

from __future__ import annotations

from typing import Any, Literal

from prefect import flow, get_run_logger

from flows.epoch_runs import EpochPlan, EpochRun, log_training_set, train_epochs
from llmrl_core.pipeline.config_io import load_config, settings_overrides
from llmrl_core.pipeline.preflight import preflight
from llmrl_core.pipeline.sft_config import SFTConfig
from storage.lineage import DataRef, LineageRecorder
from storage.trajectories import TrajectoryStore
from tasks import sft_stages as stages
from tasks.epoch_stages import evaluate_loss
from tasks.publishing import version_history


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
    refs.append(log_training_set(lineage, data, data["rows"]))
    return refs


@flow(name="sft")
def sft(
    config: str | None = None,
    run_id: str | None = None,
    source: Literal["dataset", "trajectories"] | None = None,
    dataset: str | None = None,
    limit: int | None = None,
    trajectories_run_id: str | None = None,
    epochs: int | None = None,
    lr: float | None = None,
    batch_size: int | None = None,
    overrides: list[str] | None = None,
) -> dict[str, Any]:
    """Run (or resume) SFT. Settings left empty keep the config file's values (or the built-in defaults).

    Args:
        config: YAML config file, relative to the checkout (sections data, trajectories, train, dask). Empty: the
            built-in defaults (GSM8K train chats).
        run_id: Name of the run; running an existing run id again resumes it after its last published epoch.
        source: What to train on: dataset (chats of data.source) or trajectories (a run's best stored responses).
        dataset: The chat dataset of source dataset: gsm8k:train, gsm8k:test or a .jsonl/.parquet path
            (data.source).
        limit: Train on the first N rows of the dataset (data.limit; the config's default is 64).
        trajectories_run_id: The run whose stored responses source trajectories trains on (trajectories.run_id).
        epochs: Passes over the training set, one published version each (the run's final version number).
        lr: AdamW learning rate (train.lr).
        batch_size: Samples per optimizer step (train.batch_size).
        overrides: Any other setting as section.key=value, e.g. trajectories.topk=2; applied last.
    """
    log = get_run_logger()
    typed = {
        "run_id": run_id,
        "source": source,
        "data.source": dataset,
        "data.limit": limit,
        "trajectories.run_id": trajectories_run_id,
        "epochs": epochs,
        "train.lr": lr,
        "train.batch_size": batch_size,
    }
    cfg = load_config(SFTConfig, config, [*settings_overrides(typed), *(overrides or [])])
    preflight(cfg)  # before any task, cluster, engine or write
    run = EpochRun.open(cfg, "sft")
    store_uri = cfg.trajectories.store or run.layout.trajectories_uri
    with run:
        if cfg.source == "dataset":
            data = stages.prepare_dataset(cfg, run.model_path, run.layout)
        else:
            data = stages.select_trajectories(cfg, store_uri, run.layout)
        refs = log_data(cfg, data, run.lineage, store_uri)
        samples = data["samples"]
        log.info(
            "run %s: %d training samples (%s); epochs %d..%d", cfg.run_id, data["rows"], samples, run.start, cfg.epochs
        )
        plan = EpochPlan(
            stages.trainer_setup(cfg),
            samples,
            groups_per_batch=cfg.train.batch_size,
            data=refs,
            measure=lambda trainer: {"data_loss": evaluate_loss(trainer, samples)["loss"]},
            reported_loss=("loss on the training set", "data_loss"),
        )
        train_epochs(run, plan)
    history = version_history(run.run_dir, run.final)
    summary = run.summary(samples=samples, data_loss={row["version"]: row.get("data_loss") for row in history})
    log.info("done: %s", summary)
    return summary


if __name__ == "__main__":
    sft()
