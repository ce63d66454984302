"""The collect flow's steps (:mod:`flows.collect`): the checkpoint to sample, and one attempt at the collection on
rollout workers of its own."""

from __future__ import annotations

from typing import Any

from llmrl_core.pipeline.grpo_config import GRPOConfig
from runtime.cluster import dask_cluster
from runtime.console import progress_bar
from runtime.rollout_actor import RolloutWorker
from runtime.weight_sync import EngineActorsUpdater
from storage.checkpoints import CheckpointStore
from storage.layout import RunLayout
from storage.trajectories import TrajectoryStore
from tasks import grpo_stages as stages


def checkpoint_to_sample(run_id: str, runs_dir: str | None, policy_version: int) -> str | None:
    """The weights of ``policy_version`` of ``run_id`` (None for version 0, the base model); a clear ``ValueError``
    for a version the run does not have. Cheap: the CLI calls it before the Prefect API or any engine starts."""
    if policy_version < 0:
        raise ValueError(f"--version must be 0 (the base model) or a saved version of {run_id!r}, got {policy_version}")
    if policy_version == 0:
        return None
    store = CheckpointStore(RunLayout.for_runs_dir(run_id, runs_dir).checkpoints_uri)
    have = store.versions()
    if policy_version not in have:
        saved = f"its saved versions are {have}" if have else "it has no saved version (only 0, the base model)"
        raise ValueError(f"run {run_id!r} has no checkpoint {policy_version}: {saved}")
    return str(store.weights_path(policy_version))


def collect_once(
    cfg: GRPOConfig, model: str, checkpoint: str | None, policy_version: int, batches: int, log: Any
) -> tuple[int, dict[str, Any]]:
    """One attempt at the collection (its own workers and engines): every batch again from the first, the output
    partition's staging emptied first, so an attempt after a lost worker (:func:`with_restarts`) neither loses nor
    repeats a row. Returns the rollouts collected and the partition written."""
    out_layout = RunLayout.for_runs_dir(cfg.run_id, cfg.runs_dir)
    staging_uri = out_layout.staging_uri
    # Only rollout workers are needed: the placement's trainer slot stays idle.
    with dask_cluster(cfg, out_layout.run_dir / "dask") as place:
        engines = [
            # each worker resolves the model itself (see the grpo flow)
            place.start_actor(RolloutWorker, cfg, model, worker=a)
            for a in place.rollout
        ]
        engines = [e.result() for e in engines]
        if checkpoint is not None:
            EngineActorsUpdater(engines, stage="weight load").push_version(policy_version, checkpoint)
        TrajectoryStore(staging_uri).delete_partition(cfg.run_id, policy_version)
        primer_state = None
        rows_total = 0
        bar = progress_bar(batches, f"collect {cfg.run_id}", "batch", enabled=cfg.progress)  # the console's, as grpo's
        try:
            for batch in range(batches):
                rows, primer_state = stages.load_prompts(cfg, primer_state)
                summaries = stages.rollout(
                    engines, rows, policy_version, staging_uri, shard_offset=batch * len(engines)
                )
                rows_total += sum(s["rows"] for s in summaries)
                log.info("batch %d/%d: %d rollouts", batch + 1, batches, sum(s["rows"] for s in summaries))
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix_str(f"{rows_total} rollouts")
        finally:
            if bar is not None:
                bar.close()
        written = stages.write_trajectories(cfg, staging_uri, out_layout.trajectories_uri, policy_version)
    return rows_total, written
