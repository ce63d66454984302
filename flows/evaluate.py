"""Flow ``evaluate``: GSM8K test accuracy, answer-tag rate, mean reward and pass@k of a run's policy versions.

Every version is scored on the same questions (the first ``n_questions`` of the shipped split), greedy and
sampled (``n_samples`` per question at ``temperature``, the same ``seed`` for every version), with the
training prompts and reward parser, and every metric carries a standard error over questions. Version 0 is
the base model (``model``) unless the run stored a version-0 checkpoint. One engine serves all versions:
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

from llmrl_core.envs.gsm8k import GSM8K_QUESTION_TEMPLATE, GSM8K_SYSTEM_PROMPT
from tasks.evaluate import (
    evaluate_version,
    evaluation_dir,
    log_to_mlflow,
    publish_artifacts,
    release_engines,
    resolve_versions,
    write_report,
)


@flow(name="evaluate")
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
    split: str = "test",
    model: str | None = None,
    dtype: str = "bfloat16",
    system_prompt: str | None = GSM8K_SYSTEM_PROMPT,
    question_template: str | None = GSM8K_QUESTION_TEMPLATE,
    format_reward: float = 0.1,
    correct_reward: float = 1.0,
    log_mlflow: bool = True,
    tracking_uri: str | None = None,
    keep_engine: bool = False,
) -> dict[str, Any]:
    """Evaluate ``versions`` (a list, or ``"all"``: 0 plus every stored one) of run ``run_id``; returns paths,
    the report rows and where MLflow recorded them. ``keep_engine`` keeps the engine resident after the run."""
    logger = get_run_logger()
    if k_values is None:
        k_values = [1, n_samples] if n_samples > 1 else [1]
    k_values = sorted(set(k_values))
    if n_questions < 1:
        raise ValueError(f"n_questions must be >= 1, got {n_questions}")
    settings = {
        "task": "gsm8k",
        "split": split,
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
        "system_prompt": system_prompt,
        "question_template": question_template,
        "format_reward": format_reward,
        "correct_reward": correct_reward,
    }
    chosen = resolve_versions(run_id, runs_dir, versions)
    logger.info("evaluating run %s versions %s on %s GSM8K %s questions", run_id, chosen, n_questions, split)
    try:
        outcomes = [evaluate_version(run_id, runs_dir, v, settings) for v in chosen]
    finally:
        if not keep_engine:
            release_engines()
    paths = {o["version"]: o["path"] for o in outcomes}
    out_dir = evaluation_dir(run_id, runs_dir, settings)
    title = f"{run_id}: GSM8K {split}, {n_questions} questions, greedy + {n_samples} samples at T={temperature}"
    report = write_report(paths, str(out_dir), title)
    artifacts = publish_artifacts(report, f"evaluate-{run_id}", title)
    mlflow_info = log_to_mlflow(run_id, runs_dir, settings, report, paths, tracking_uri) if log_mlflow else {}
    logger.info("report: %s and %s", report["markdown"], report["png"])
    return {
        "run_id": run_id,
        "versions": chosen,
        "out_dir": str(out_dir),
        "results": {str(v): p for v, p in paths.items()},
        "report_markdown": report["markdown"],
        "report_png": report["png"],
        "rows": report["rows"],
        "artifacts": artifacts,
        "mlflow": mlflow_info,
        "reused": [o["version"] for o in outcomes if o["reused"]],
    }


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(f"usage: python -m flows.evaluate RUN_ID [RUNS_DIR]  (see {Path(__file__).name})")
    evaluate(sys.argv[1], runs_dir=sys.argv[2] if len(sys.argv) > 2 else None)
