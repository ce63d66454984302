"""Flow ``offline``: GRPO from a run's stored trajectories -- no new rollouts -- into a new run.

    source partitions (run, chosen versions) -> re-score (optional: rescore.reward) -> advantages (mc_advantage
    per prompt group) -> re-scored partitions + training set -> resident GRPO trainer on a Dask worker
    -> per epoch: mini-batches of whole groups, publish version e+1, lineage (MLflow, pipeline "offline"), commit

The importance ratio of ``GRPOLoss`` compares the trained policy with the stored sampler log-probs, so the
clip keeps each step close to the policy that generated the data. Version 0 is the starting model
(``model``); the same run id resumes after its last published epoch, exactly as the SFT and GRPO flows (the
epoch loop is :mod:`flows.epoch_runs`, shared with the SFT flow).
Run it with ``llmrl run offline --set source.run_id=R --set rescore.reward=gsm8k_strict``.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from flows.epoch_runs import EpochPlan, EpochRun, log_training_set, train_epochs
from llmrl_core.pipeline.config_io import load_config, settings_overrides
from llmrl_core.pipeline.offline_config import OfflineConfig
from llmrl_core.pipeline.preflight import preflight
from storage.lineage import DataRef, LineageRecorder
from storage.trajectories import TrajectoryStore
from tasks import offline_stages as stages


def log_data(cfg: OfflineConfig, data: dict[str, Any], lineage: LineageRecorder, store_uri: str) -> list[DataRef]:
    """Record what is trained on: the source partitions, the re-scored ones and the tokenized file."""
    src = cfg.source.run_id
    source, rescored = TrajectoryStore(store_uri), TrajectoryStore(data["rescored_store"])
    for version in data["versions"]:
        lineage.log_trajectory_partition(source, version, run_id=src, context="source")
    refs = [lineage.log_trajectory_partition(rescored, v, run_id=src) for v in data["versions"]]
    refs.append(log_training_set(lineage, data, data["trained_rows"]))
    return refs


@flow(name="offline")
def offline(
    config: str | None = None,
    run_id: str | None = None,
    source_run_id: str | None = None,
    source_versions: list[int] | None = None,
    reward: str | None = None,
    epochs: int | None = None,
    groups_per_step: int | None = None,
    lr: float | None = None,
    overrides: list[str] | None = None,
) -> dict[str, Any]:
    """Run (or resume) offline GRPO. Settings left empty keep the config file's values (or the built-in defaults).

    Args:
        config: YAML config file, relative to the checkout (sections source, rescore, train, dask). Empty: the
            built-in defaults.
        run_id: Name of the new run (not the source run); running it again resumes after its last published epoch.
        source_run_id: The run whose stored trajectories are trained on (source.run_id).
        source_versions: Which of its policy versions to read (source.versions); empty: every stored version.
        reward: The reward to re-score the stored responses with (rescore.reward): stored (as recorded), gsm8k,
            gsm8k_strict (no format bonus), brevity or env (env.rewards).
        epochs: Passes over the training set, one published version each (the run's final version number).
        groups_per_step: Prompt groups per mini-batch (groups_per_step).
        lr: AdamW learning rate (train.lr).
        overrides: Any other setting as section.key=value, e.g. train.kl_coef=0.01; applied last.
    """
    log = get_run_logger()
    typed = {
        "run_id": run_id,
        "source.run_id": source_run_id,
        "source.versions": source_versions,
        "rescore.reward": reward,
        "epochs": epochs,
        "groups_per_step": groups_per_step,
        "train.lr": lr,
    }
    cfg = load_config(OfflineConfig, config, [*settings_overrides(typed), *(overrides or [])])
    preflight(cfg)  # before any task, cluster, engine or write
    run = EpochRun.open(cfg, "offline")
    store_uri = cfg.source.store or run.layout.trajectories_uri
    src = cfg.source.run_id
    with run:
        data = stages.rescore(cfg, store_uri, run.layout)
        refs = log_data(cfg, data, run.lineage, store_uri)
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
        plan = EpochPlan(
            stages.trainer_setup(cfg),
            data["samples"],
            groups_per_batch=cfg.groups_per_step,
            steps_per_batch=cfg.train.steps_per_iteration,
            data=refs,
            fixed_metrics={k: float(data[k]) for k in ("reward_mean", "stored_reward_mean", "changed_rewards")},
        )
        train_epochs(run, plan)
    summary = run.summary(
        source_run_id=src,
        **{k: data[k] for k in ("versions", "rows", "trained_rows", "reward_mean", "stored_reward_mean")},
        rescored=data["rescored_store"],
        samples=data["samples"],
    )
    log.info("done: %s", summary)
    return summary


if __name__ == "__main__":
    offline()
