"""Flow ``grpo``: iterative GRPO, one policy version per iteration, stage by stage.

    prompts -> rollouts (resident vLLM engines) -> reference KL (if kl_coef > 0) -> advantages
            -> trajectories (Parquet, by policy version) -> train (resident trainer) -> publish weights
            -> lineage (MLflow) -> commit

A version is *published* once its commit marker exists (checkpoint, optimizer/RNG state, engines loaded,
lineage logged, data cursor saved). The engines get a new version as soon as its weights file is written; the
rest of its publish (checkpoint file, hash and manifest, optimizer state, then lineage and marker) completes
beside the next batch's rollouts. Running the same run id
again resumes after the last published version: that iteration's partition is rebuilt from scratch (same prompts,
same seeds), nothing published is repeated. Run it with
``llmrl run grpo [--config x.yaml] [--set section.key=value ...]``.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from llmrl_core.pipeline.config_io import load_config
from llmrl_core.pipeline.grpo_config import GRPOConfig
from llmrl_core.pipeline.preflight import final_eval_source, preflight
from tasks import grpo_run
from tasks.publishing import PendingPublish
from tasks.run_identity import attempts, named_at_creation


@flow(
    name="grpo", flow_run_name=named_at_creation(GRPOConfig, lambda cfg: cfg.iterations), validate_parameters=False
)  # the config validates itself (load_config), with llmrl's messages
def grpo(
    config: str | None = None,
    settings: GRPOConfig | None = None,
    overrides: list[str] | None = None,
) -> dict[str, Any]:
    """Run (or resume) GRPO: the built-in defaults, then the config file, then ``settings``, then ``overrides``.

    Args:
        config: YAML config file, relative to the checkout (e.g. llmrl_cli/main_job.yaml: two-digit addition;
            recipes/gsm8k-demo.yaml: GSM8K). Empty: the built-in defaults.
        settings: Every setting of the run, by section (the run form shows them all); the ones given replace the
            config file's. The same run_id resumes the run after its last published version.
        overrides: Any setting as section.key=value, e.g. train.kl_coef=0.01; applied last.
    """
    log = get_run_logger()
    cfg = load_config(GRPOConfig, config, overrides or [], settings=settings)
    preflight(cfg)  # before any task, cluster, engine or write
    return attempts(lambda: run_grpo(cfg, log), cfg.dask.restarts, log)


def run_grpo(cfg: GRPOConfig, log: Any) -> dict[str, Any]:
    """One attempt at the run ``cfg``: resume after its last committed version (or start it), on workers of its
    own (a fresh local cluster, or the joined cluster's), and train to ``cfg.iterations``; then the final
    evaluation. A :class:`~runtime.actor_calls.WorkerLost` leaves every committed version in place, so a new attempt
    resumes exactly there (:func:`grpo` makes up to ``dask.restarts`` of them).

    Each iteration is the module docstring's diagram (:func:`tasks.grpo_run.iteration`); the start-up (where to
    resume, the run's records, the resident actors and the weight route) is :func:`tasks.grpo_run.resume_point` and
    :func:`tasks.grpo_run.resident_run`."""
    point = grpo_run.resume_point(cfg, log)
    # each version's report is written while the next iteration runs (the last one is waited for on leaving)
    with grpo_run.resident_run(cfg, point, log) as run:
        grpo_run.first_version(run, point)
        ahead = grpo_run.rollouts_ahead(run, point)
        bar = grpo_run.iteration_bar(cfg, point.start)
        if bar is not None:  # closed on any way out: an error line then starts a line of its own
            run.closing.callback(bar.close)
        pending: PendingPublish | None = None  # the version the engines hold, committed beside the next rollouts
        for version in range(point.start, cfg.iterations):
            pending = grpo_run.iteration(run, ahead, version, pending, bar)
        if pending is not None:
            pending.complete()
        if bar is not None:
            bar.close()
    return grpo_run.finish(cfg, point, run.lineage, log, final_evaluation)


def final_evaluation(cfg: GRPOConfig, final: int) -> dict[str, Any]:
    """Evaluate version 0 and ``final`` on held-out problems (the evaluate flow, as a subflow)."""
    from flows.evaluate import evaluate

    e = cfg.final_eval
    out = evaluate(
        cfg.run_id,
        versions=[0, final],
        runs_dir=cfg.runs_dir,
        n_questions=e.questions,
        n_samples=e.samples,
        k_values=[1],
        temperature=cfg.rollout.temperature,
        seed=cfg.seed,
        max_new_tokens=cfg.rollout.max_new_tokens,
        model=cfg.model,
        dtype=cfg.rollout.dtype,
        backend=cfg.rollout.backend,
        tracking_uri=cfg.tracking_uri,
        progress=cfg.progress,
    )
    greedy = {row["version"]: row for row in out["rows"] if row["mode"] == "greedy"}
    base, last = greedy[0], greedy[final]
    line = (
        f"held-out accuracy {base['accuracy']:.2f} -> {last['accuracy']:.2f} "
        f"({last['delta_accuracy']:+.2f} ± {last['delta_accuracy_se']:.2f}, z = {last['z']:.1f}; greedy, "
        f"{last['num_questions']} problems of {final_eval_source(cfg)}, version 0 -> {final})"
    )
    return {"line": line, "report": out["report_markdown"], "curves": out["report_png"], "rows": out["rows"]}


if __name__ == "__main__":
    grpo()
