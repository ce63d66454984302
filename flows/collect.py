"""Flow ``collect``: rollouts only — sample a stored policy version and keep every response, no training.

    prompts -> rollouts (resident vLLM engines at the chosen version) -> advantages -> trajectories

The engines load the checkpoint ``policy_version`` of the config's ``run_id`` (0 = the base model, which
needs no checkpoint); the rows go to the trajectory store under ``out_run_id`` (default
``<run_id>-collect``), partition ``policy_version``, one shard per (batch, worker). Re-running replaces the
same shards. Run it with ``llmrl run collect --version 2 --batches 4 [--config x.yaml] [--set k=v]``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from prefect import flow, get_run_logger

from llmrl_core.pipeline.config_io import load_config
from llmrl_core.pipeline.grpo_config import GRPOConfig
from llmrl_core.pipeline.preflight import check_run_id, preflight
from runtime.cluster import dask_cluster
from runtime.console import progress_bar
from runtime.rollout_actor import RolloutWorker
from runtime.weight_sync import EngineActorsUpdater
from storage.checkpoints import CheckpointStore
from storage.layout import RunLayout
from storage.trajectories import TrajectoryStore
from tasks import grpo_stages as stages
from tasks.reporting import artifact_key, live_markdown
from tasks.run_identity import attempts


def checkpoint_to_sample(run_id: str, layout: RunLayout, policy_version: int) -> str | None:
    """The weights of ``policy_version`` of ``run_id`` (None for version 0, the base model); a clear ``ValueError``
    for a version the run does not have. Cheap: the CLI calls it before the Prefect API or any engine starts."""
    if policy_version < 0:
        raise ValueError(f"--version must be 0 (the base model) or a saved version of {run_id!r}, got {policy_version}")
    if policy_version == 0:
        return None
    store = CheckpointStore(layout.checkpoints_uri)
    have = store.versions()
    if policy_version not in have:
        saved = f"its saved versions are {have}" if have else "it has no saved version (only 0, the base model)"
        raise ValueError(f"run {run_id!r} has no checkpoint {policy_version}: {saved}")
    return str(store.weights_path(policy_version))


@flow(name="collect", validate_parameters=False)  # the config validates itself (load_config), with llmrl's messages
def collect(
    config: str | None = None,
    settings: GRPOConfig | None = None,
    overrides: list[str] | None = None,
    policy_version: int = 0,
    batches: int = 1,
    out_run_id: str | None = None,
) -> dict[str, Any]:
    """Collect ``batches`` batches of rollouts with ``policy_version`` of the configured run.

    Args:
        config: YAML config file of the run (the same sections as grpo), relative to the checkout.
        settings: The run's settings by section; the ones given replace the config file's.
        overrides: Any setting as section.key=value; applied last.
        policy_version: The stored version of the run to sample (0: the base model).
        batches: How many batches of data.prompts_per_iteration prompts.
        out_run_id: The run id the rollouts are stored under (default <run_id>-collect).
    """
    log = get_run_logger()
    cfg = load_config(GRPOConfig, config, overrides or [], settings=settings)
    preflight(cfg, training=False)  # before any task, cluster, engine or write (a collect only samples)
    out_run = check_run_id(out_run_id, "out_run_id") if out_run_id else f"{cfg.run_id}-collect"
    layout = RunLayout.for_runs_dir(cfg.run_id, cfg.runs_dir)
    collect_cfg = dataclasses.replace(cfg, run_id=out_run)  # the engines tag and stage the rows as the output run
    checkpoint = checkpoint_to_sample(cfg.run_id, layout, policy_version)
    rows_total, written = attempts(
        lambda: collect_once(collect_cfg, cfg.model, checkpoint, policy_version, batches, log),
        cfg.dask.restarts,
        log,
        again="collecting again from the first batch",
    )
    log.info(
        "collected %d rollouts of %s version %d into %s", rows_total, cfg.run_id, policy_version, written["partition"]
    )
    live_markdown(
        artifact_key(out_run, "collected"),
        f"## {out_run}\n\n{rows_total} rollouts of `{cfg.run_id}` version {policy_version} in {batches} batch(es), "
        f"stored in `{written['partition']}`.\n\n"
        f"Read them: `llmrl trajectories show {out_run} --version {policy_version}`",
        f"rollouts collected from {cfg.run_id} v{policy_version}",
    )
    return {"run_id": out_run, "policy_version": policy_version, **written}


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


if __name__ == "__main__":
    collect()
