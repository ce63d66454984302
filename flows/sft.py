"""Flow ``sft``: supervised fine-tuning from a chat dataset or from a run's best stored responses.

    data: chats (jsonl / parquet / GSM8K) -> tokenize with assistant-only masks
       or stored trajectories -> TopKRewardSelector (rejection sampling) -> their stored tokens and masks
    -> training set (one Parquet file) -> resident trainer (SFTLoss) on a Dask worker
    -> per epoch: train, loss on the training set, publish version e+1 (checkpoint + optimizer/RNG state),
       lineage (MLflow, pipeline "sft"), commit

Version 0 is the starting model. Like GRPO, a version counts once its commit marker exists, and running the
same run id again resumes after the last published epoch (weights, optimizer and RNG restored; each epoch's
batch order depends only on (seed, epoch)). Raising ``epochs`` extends a finished run. The epoch loop is
:mod:`tasks.epoch_runs`, shared with the offline flow.
Run it with ``llmrl run sft [--config x.yaml] [--set section.key=value ...]``.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from llmrl_core.pipeline.config_io import load_config
from llmrl_core.pipeline.preflight import preflight
from llmrl_core.pipeline.sft_config import SFTConfig
from tasks import sft_stages as stages
from tasks.epoch_runs import EpochPlan, EpochRun, train_epochs
from tasks.epoch_stages import evaluate_loss
from tasks.publishing import version_history
from tasks.run_identity import attempts, named_at_creation


@flow(
    name="sft", flow_run_name=named_at_creation(SFTConfig, lambda cfg: cfg.epochs), validate_parameters=False
)  # the config validates itself (load_config), with llmrl's messages
def sft(
    config: str | None = None,
    settings: SFTConfig | None = None,
    overrides: list[str] | None = None,
) -> dict[str, Any]:
    """Run (or resume) SFT: the built-in defaults, then the config file, then ``settings``, then ``overrides``.

    Args:
        config: YAML config file, relative to the checkout (sections data, trajectories, train, dask). Empty: the
            built-in defaults (GSM8K train chats).
        settings: Every setting of the run, by section (the run form shows them all); the ones given replace the
            config file's. source: dataset trains on the chats of data.source, trajectories on a run's best stored
            responses (trajectories.run_id). The same run_id resumes the run after its last published epoch.
        overrides: Any setting as section.key=value, e.g. trajectories.topk=2; applied last.
    """
    log = get_run_logger()
    cfg = load_config(SFTConfig, config, overrides or [], settings=settings)
    preflight(cfg)  # before any task, cluster, engine or write
    return attempts(lambda: run_sft(cfg, log), cfg.dask.restarts, log)


def run_sft(cfg: SFTConfig, log: Any) -> dict[str, Any]:
    """One attempt at the SFT run ``cfg``: resume after its last published epoch (or start it) on workers of
    its own and train to ``cfg.epochs``."""
    run = EpochRun.open(cfg, "sft")
    store_uri = cfg.trajectories.store or run.layout.trajectories_uri
    with run:
        if cfg.source == "dataset":
            data = stages.prepare_dataset(cfg, run.model_path, run.layout)
        else:
            data = stages.select_trajectories(cfg, store_uri, run.layout)
        refs = stages.log_data(cfg, data, run.lineage, store_uri)
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
