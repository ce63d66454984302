"""Flow ``evaluate``: held-out accuracy, answer-tag rate, mean reward and pass@k of a run's policy versions.

Every version is scored on the same held-out questions (the first ``n_questions`` of ``source``, by default
the run's ``task.eval_source``: GSM8K test, or the arithmetic test split for the arithmetic recipe), greedy
and sampled (``n_samples`` per question at ``temperature``, the same ``seed`` for every version), with the
prompt format and reward parser the run trained with (the ``task`` section of ``RUN/config.json``; keys of
``task`` override it), and every metric carries a standard error over questions. A run whose env has tools,
several turns, a game or a factory (``env`` of ``RUN/config.json``) is scored by playing each question to the
end of its episode in that env, as its rollouts were, with tool-call rate and tool success rate per version.
A run with ``env.agent`` is scored by its agent: each question is played by the agent against the OpenAI endpoint
served from the evaluation engine at each version, with this evaluation's sampling imposed (greedy, and
``n_samples`` at ``temperature``); accuracy is task success (the agent's ``success`` entry, else reward > 0;
see :mod:`llmrl_core.evaluation.agent_eval`). The agent module must be importable here (``PYTHONPATH``).
Version 0 is the base model (``model``) unless the run stored a version-0 checkpoint. One engine serves all versions:
each version's weights are loaded into it in turn. The report (a table with the paired change in accuracy
against version 0, and a curve PNG) goes to ``RUN/evaluations/<settings hash>/``, to MLflow (experiment
``evaluate`` in the run's tracking store) and to Prefect artifacts.

Run it directly::

    python -m flows.evaluate RUN_ID            # all versions, default settings
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from llmrl_core.pipeline.preflight import PreflightError, check_run_id, held_out_source, source_rows
from tasks.evaluate import (
    EvaluationBar,
    answers_per_version,
    check_run_exists,
    env_scoring,
    evaluate_version,
    evaluation_dir,
    log_to_mlflow,
    publish_artifacts,
    question_texts,
    release_engines,
    resolve_versions,
    run_agent_settings,
    run_env,
    run_logs,
    run_task,
    write_report,
)
from tasks.run_identity import tag_flow_run


@flow(name="evaluate", flow_run_name="{run_id} evaluate")  # named like the run it evaluates (not at random)
def evaluate(
    run_id: str,
    versions: list[int] | str = "all",
    runs_dir: str | None = None,
    n_questions: int = 100,
    n_samples: int = 4,
    k_values: list[int] | None = None,
    temperature: float = 0.7,
    seed: int = 0,
    max_new_tokens: int = 256,
    greedy: bool = True,
    source: str | None = None,
    task: dict[str, Any] | None = None,
    model: str | None = None,
    dtype: str = "auto",
    backend: str = "vllm",
    log_mlflow: bool = True,
    tracking_uri: str | None = None,
    keep_engine: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Evaluate ``versions`` (a list, or ``"all"``: 0 plus every stored one) of run ``run_id``; returns paths,
    the report rows and where MLflow recorded them. ``source`` names the held-out prompts (default: the run's
    ``task.eval_source``), ``task`` overrides keys of the run's task section (prompt format, rewards).
    ``keep_engine`` keeps the engine resident after the run; ``backend`` is the engine's (``vllm`` or
    ``transformers``, as ``rollout.backend``). ``progress``: a bar on the console over every version's answers
    (rate and ETA), as ``grpo``'s over its versions."""
    check_run_id(run_id)
    check_run_exists(run_id, runs_dir)
    env = run_env(run_id, runs_dir)
    scoring = env_scoring(env)
    if backend not in ("vllm", "transformers"):
        raise PreflightError(f"backend: must be vllm or transformers, got {backend!r}")
    if backend == "transformers" and (scoring == "agent" or env.get("verifiers")):
        what = f"agent {env['agent']}" if scoring == "agent" else f"verifiers environment {env['verifiers']}"
        raise PreflightError(
            f"backend: run {run_id!r} trained the {what}, which talks to an OpenAI-compatible endpoint that only a "
            "vLLM engine serves; evaluate it with backend=vllm"
        )
    tag_flow_run("llmrl", f"run:{run_id}", "evaluation")  # found with the run's own flow runs in the UI
    logger = get_run_logger()
    if k_values is None:
        k_values = [1, n_samples] if n_samples > 1 else [1]
    k_values = sorted(set(k_values))
    if n_questions < 1:
        raise ValueError(f"n_questions must be >= 1, got {n_questions}")
    task_cfg = run_task(run_id, runs_dir, task)
    if scoring == "episode":
        logger.info("run %s trained in env %s: every episode is played in it, tools and turns included", run_id, env)
    elif scoring == "agent":
        logger.info("run %s trained agent %s: it plays every question against each version", run_id, env["agent"])
    source = source or held_out_source(env.get("name"), task_cfg.eval_source)
    settings = {
        "env": env if scoring in ("episode", "agent") else ("ifeval" if scoring == "ifeval" else "gsm8k"),
        "scoring": scoring,
        "task": task_cfg.to_dict(),
        "source": source,
        "n_questions": n_questions,
        "n_samples": n_samples,
        "k_values": k_values,
        "temperature": temperature,
        "top_p": 1.0,
        "seed": seed,
        "max_new_tokens": max_new_tokens,
        "greedy": greedy,
        "model": model,
        "dtype": dtype,
        "backend": backend,
        **(run_agent_settings(run_id, runs_dir) if scoring == "agent" else {}),
    }
    chosen = resolve_versions(run_id, runs_dir, versions)
    source_rows(source, "source", env_options=env.get("options"))  # opens, has rows: before the engine starts
    logger.info("evaluating run %s versions %s on %s questions of %s", run_id, chosen, n_questions, source)
    bar = EvaluationBar(run_id, chosen, answers_per_version(settings), enabled=progress)  # shown before the engine
    outcomes = []
    try:
        with run_logs(run_id, runs_dir):  # vLLM's log to <run>/logs/ (-v: here)
            for v in chosen:
                outcomes.append(evaluate_version(run_id, runs_dir, v, settings, bar.for_version(v)))
                bar.finished(v, outcomes[-1]["reused"])
    finally:
        bar.close()
        if not keep_engine:
            release_engines()
    paths = {o["version"]: o["path"] for o in outcomes}
    out_dir = evaluation_dir(run_id, runs_dir, settings)
    title = f"{run_id}: {source}, {n_questions} questions, greedy + {n_samples} samples at T={temperature}"
    report = write_report(paths, str(out_dir), title, question_texts(settings))
    artifacts = publish_artifacts(report, f"evaluate-{run_id}", title)
    mlflow_info = log_to_mlflow(run_id, runs_dir, settings, report, paths, tracking_uri) if log_mlflow else {}
    for line in report["verdict"].splitlines():
        logger.info("%s", line.removeprefix("- "))
    logger.info("report: %s and %s", report["markdown"], report["png"])
    return {
        "run_id": run_id,
        "versions": chosen,
        "out_dir": str(out_dir),
        "results": {str(v): p for v, p in paths.items()},
        "report_markdown": report["markdown"],
        "report_png": report["png"],
        "rows": report["rows"],
        "verdict": report["verdict"],
        "side_by_side": report["side_by_side"],
        "artifacts": artifacts,
        "mlflow": mlflow_info,
        "reused": [o["version"] for o in outcomes if o["reused"]],
    }


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(f"usage: python -m flows.evaluate RUN_ID [RUNS_DIR]  (see {Path(__file__).name})")
    evaluate(sys.argv[1], runs_dir=sys.argv[2] if len(sys.argv) > 2 else None)
