"""The offline-training stages as thin Prefect tasks: re-score stored trajectories, recompute advantages, and
write the training set that the resident GRPO trainer runs epochs over (training itself reuses
:mod:`tasks.epoch_stages`' train-epoch task).

The re-scored rows keep their original run id and policy version (they are still that policy's samples) and
are written to the offline run's own ``rescored/`` trajectory store, with the new reward's parts in
``reward_components`` and the stored reward kept as ``stored_reward``: lineage names the source partitions
and the re-scored ones, and ``llmrl trajectories`` can read both.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from prefect import task

from llmrl_core.objectives import mc_advantage
from llmrl_core.pipeline.offline_config import OfflineConfig
from llmrl_core.pipeline.rescoring import make_rescorer
from runtime.records import record_to_sample
from runtime.sft_actor import TrainerSetup
from runtime.train_data import write_samples
from storage.layout import RunLayout
from storage.lineage import DataRef, LineageRecorder
from storage.trajectories import TrajectoryStore
from tasks.epoch_runs import log_training_set
from tasks.grpo_stages import STAGE


@task(name="rescore-trajectories", retries=1, **STAGE)
def rescore(cfg: OfflineConfig, store_uri: str, layout: RunLayout) -> dict[str, Any]:
    """Re-score the chosen partitions, recompute group advantages, write the re-scored rows and the training set
    (in the run's data store)."""
    src = cfg.source.run_id
    source, rescored = TrajectoryStore(store_uri), TrajectoryStore(layout.data_location("rescored"))
    versions = source.chosen_versions(src, cfg.source.versions)
    options = dict(cfg.rescore.options)
    if cfg.rescore.reward == "env":
        options["rewards"] = cfg.env.rewards
    scorer = make_rescorer(cfg.rescore.reward, cfg.rescore.answers, **options)
    by_version, stored, changed = {}, [], 0
    for version in versions:
        records = source.read_records(src, version=version)
        if not records:
            raise ValueError(f"run {src!r} has no trajectories for version {version} in {store_uri}")
        for record in records:
            out = scorer(dataclasses.asdict(record))
            stored.append(record.reward)
            changed += out["reward"] != record.reward
            if cfg.rescore.reward != "stored":
                record.reward_components = {
                    "stored_reward": record.reward,
                    **{k: v for k, v in out.items() if k != "reward"},
                }
                record.reward = float(out["reward"])
        by_version[version] = records
    rows = [r for version in versions for r in by_version[version]]
    groups = [f"{r.policy_version}/{r.group_id}" for r in rows]  # group ids are per run; versions never share one
    result = mc_advantage([r.reward for r in rows], groups)
    for record, advantage in zip(rows, result.advantages.tolist(), strict=True):
        record.advantage = float(advantage)
    for version in versions:
        rescored.delete_partition(src, version)
        rescored.write_shard(src, version, 0, by_version[version])
    signal = {g for g, r in zip(groups, rows, strict=True) if r.advantage != 0.0}
    keep = [i for i, g in enumerate(groups) if g in signal or not cfg.skip_zero_signal]
    if not keep:
        raise ValueError(
            f"no prompt group of run {src!r} versions {versions} has unequal rewards under reward "
            f"{cfg.rescore.reward!r}: every advantage is 0, nothing to learn"
        )
    samples = write_samples(
        layout.data_location("offline-data", "samples.parquet"),
        [record_to_sample(rows[i]) for i in keep],
        [groups[i] for i in keep],
    )
    return {
        "samples": samples.location,
        "samples_sha256": samples.sha256,
        "rows": len(rows),
        "trained_rows": len(keep),
        "versions": versions,
        "rescored_store": rescored.uri,
        "stored_reward_mean": sum(stored) / len(stored),
        "reward_mean": sum(r.reward for r in rows) / len(rows),
        "changed_rewards": int(changed),
        **{k: int(v) for k, v in result.stats.items()},
    }


def trainer_setup(cfg: OfflineConfig) -> TrainerSetup:
    """The resident GRPO trainer of an offline run (the options of the GRPO flow's trainer)."""
    t = cfg.train
    options: dict[str, Any] = dict(
        clip_epsilon=t.clip_epsilon,
        aggregation=t.aggregation,
        entropy_coeff=t.entropy_coeff,
        kl_estimator=t.kl_estimator,
        entropy_bonus=t.entropy_coeff > 0,
    )
    if t.kl_coef > 0:
        options["kl_to_ref_coeff"] = t.kl_coef
    return TrainerSetup.for_run(cfg, "grpo", options, ref_model=t.kl_coef > 0)


def log_data(cfg: OfflineConfig, data: dict[str, Any], lineage: LineageRecorder, store_uri: str) -> list[DataRef]:
    """Record what is trained on: the source partitions, the re-scored ones and the tokenized file."""
    src = cfg.source.run_id
    source, rescored = TrajectoryStore(store_uri), TrajectoryStore(data["rescored_store"])
    for version in data["versions"]:
        lineage.log_trajectory_partition(source, version, run_id=src, context="source")
    refs = [lineage.log_trajectory_partition(rescored, v, run_id=src) for v in data["versions"]]
    refs.append(log_training_set(lineage, data, data["trained_rows"]))
    return refs
