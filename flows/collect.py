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
from tasks.collect_run import checkpoint_to_sample, collect_once
from tasks.reporting import artifact_key, live_markdown
from tasks.run_identity import attempts, collect_run_name, tag_flow_run


@flow(
    name="collect", flow_run_name=collect_run_name, validate_parameters=False
)  # the config validates itself (load_config), with llmrl's messages
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
    tag_flow_run("llmrl", f"run:{out_run}", f"run:{cfg.run_id}", "collect")  # found with both runs in the UI
    collect_cfg = dataclasses.replace(cfg, run_id=out_run)  # the engines tag and stage the rows as the output run
    checkpoint = checkpoint_to_sample(cfg.run_id, cfg.runs_dir, policy_version)
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


if __name__ == "__main__":
    collect()
