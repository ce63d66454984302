"""Flow ``offline``: GRPO from a run's stored trajectories -- no new rollouts -- into a new run.

    source partitions (run, chosen versions) -> re-score (optional: rescore.reward) -> advantages (mc_advantage
    per prompt group) -> re-scored partitions + training set -> resident GRPO trainer on a Dask worker
    -> per epoch: mini-batches of whole groups, publish version e+1, lineage (MLflow, pipeline "offline"), commit

The importance ratio of ``GRPOLoss`` compares the trained policy with the stored sampler log-probs, so the
clip keeps each step close to the policy that generated the data. Version 0 is the starting model
(``model``); the same run id resumes after its last published epoch, exactly as the SFT and GRPO flows (the
epoch loop is :mod:`tasks.epoch_runs`, shared with the SFT flow).
Run it with ``llmrl run offline --set source.run_id=R --set rescore.reward=gsm8k_strict``.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from llmrl_core.pipeline.config_io import load_config
from llmrl_core.pipeline.offline_config import OfflineConfig
from llmrl_core.pipeline.preflight import preflight
from tasks import offline_stages as stages
from tasks.epoch_runs import EpochPlan, EpochRun, train_epochs
from tasks.run_identity import attempts, named_at_creation


@flow(
    name="offline", flow_run_name=named_at_creation(OfflineConfig, lambda cfg: cfg.epochs), validate_parameters=False
)  # the config validates itself (load_config), with llmrl's messages
def offline(
    config: str | None = None,
    settings: OfflineConfig | None = None,
    overrides: list[str] | None = None,
) -> dict[str, Any]:
    """Run (or resume) offline GRPO: the built-in defaults, then the config file, then ``settings``, then
    ``overrides``.

    Args:
        config: YAML config file, relative to the checkout (sections source, rescore, train, dask). Empty: the
            built-in defaults.
        settings: Every setting of the run, by section (the run form shows them all); the ones given replace the
            config file's. source.run_id is the run whose stored trajectories are trained on, rescore.reward the
            reward they are re-scored with; run_id names the new run (the same run_id resumes it).
        overrides: Any setting as section.key=value, e.g. train.kl_coef=0.01; applied last.
    """
    log = get_run_logger()
    cfg = load_config(OfflineConfig, config, overrides or [], settings=settings)
    preflight(cfg)  # before any task, cluster, engine or write
    return attempts(lambda: run_offline(cfg, log), cfg.dask.restarts, log)


def run_offline(cfg: OfflineConfig, log: Any) -> dict[str, Any]:
    """One attempt at the offline run ``cfg``: resume after its last published epoch (or start it) on workers
    of its own and train to ``cfg.epochs``."""
    run = EpochRun.open(cfg, "offline")
    store_uri = cfg.source.store or run.layout.trajectories_uri
    src = cfg.source.run_id
    with run:
        data = stages.rescore(cfg, store_uri, run.layout)
        refs = stages.log_data(cfg, data, run.lineage, store_uri)
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
