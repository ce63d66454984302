"""Stages of the evaluate flow: pick versions, score one version, write the report, publish it.

* One resident engine per process serves every version: :func:`resident_worker` keeps a
  :class:`~llmrl_core.modules.backends.vllm.worker.vLLMWorker` per engine config, and :func:`evaluate_version`
  loads the version's weights into it (a stored checkpoint, or the base model's own weights for an
  unstored version 0), skipping the load when the engine already holds them.
* Each version's result is a JSON file under ``RUN/evaluations/<settings hash>/``, written atomically and
  keyed by the evaluation settings and the weights' sha256, so a re-run (or a retry) reuses finished
  versions instead of sampling them again.
* Tasks pass paths and summaries; responses stay in the result files.
* :class:`EvaluationBar` is the console's progress bar over every version's answers (greedy and sampled):
  :func:`evaluate_version` reports to it as the engine calls finish (a reused version leaves the total).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_image_artifact, create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from llmrl_core.builtin_data.sources import load_source_rows
from llmrl_core.evaluation import (
    evaluate_gsm8k,
    evaluate_ifeval,
    format_rows,
    load_result,
    markdown_table,
    plot_curves,
    report_rows,
)
from llmrl_core.evaluation.gsm8k_eval import Progress
from llmrl_core.evaluation.report import side_by_side, verdict_lines
from llmrl_core.evaluation.results import save_result, write_text_atomic
from llmrl_core.model_store import base_state_dict, resolve_model
from llmrl_core.modules.backends.types import EngineConfig, SamplingConfig
from llmrl_core.modules.backends.vllm.worker import start_engine, vLLMWorker
from llmrl_core.pipeline.preflight import PreflightError
from llmrl_core.pipeline.task_config import TaskConfig
from runtime.console import library_logs, progress_bar
from storage.checkpoints import CheckpointStore
from storage.hashing import config_hash
from storage.layout import RunLayout, default_runs_root
from tasks.reporting import artifact_key

_RESIDENT: dict[str, dict[str, Any]] = {}  # engine-config hash -> {"worker": vLLMWorker, "weights": source id}


def question_rows(settings: dict[str, Any]) -> list[dict[str, Any]]:
    """The settings' held-out questions (the first ``n_questions`` rows of ``source``)."""
    scoring = settings.get("scoring", "ifeval" if settings.get("env") == "ifeval" else "single_turn")
    if scoring == "ifeval" or (scoring == "episode" and settings["env"].get("name") == "ifeval"):
        return ifeval_rows(settings["source"], settings["n_questions"])
    env = settings["env"] if isinstance(settings["env"], dict) else {}
    return load_source_rows(settings["source"], limit=settings["n_questions"], env_options=env.get("options"))


def question_texts(settings: dict[str, Any]) -> list[str]:
    """The text of each held-out question, by index (its ``question`` or ``prompt`` field)."""
    return [str(r.get("question", r.get("prompt", ""))) for r in question_rows(settings)]


def ifeval_rows(source: str, limit: int) -> list[dict[str, Any]]:
    """The first ``limit`` IFEval rows of ``source`` (``ifeval``: the shipped prompts, or a jsonl path)."""
    from llmrl_core.builtin_data.ifeval_data import load_ifeval
    from llmrl_core.builtin_data.sources import resolve_source

    return load_ifeval(resolve_source(source) if source.startswith("ifeval") else source, limit=limit)


def engine_config_for(settings: dict[str, Any]) -> EngineConfig:
    """The engine an evaluation runs on: the base model at the evaluation's dtype and seed."""
    return EngineConfig(
        model=settings["model"],
        dtype=settings["dtype"],
        seed=settings["seed"],
        kv_cache_gb=settings.get("kv_cache_gb", 1.0),
        max_model_len=settings.get("max_model_len", 2048),
        backend=settings.get("backend", "vllm"),
    )


def resident_worker(config: EngineConfig) -> dict[str, Any]:
    """This process's engine for ``config`` (started on first use): ``{"worker", "weights"}``."""
    key = config_hash(config)
    if key not in _RESIDENT:
        _RESIDENT[key] = {"worker": start_engine(config), "weights": base_weights_id(config.model)}
    return _RESIDENT[key]


def release_engines() -> int:
    """Drop this process's resident evaluation engines; returns how many were dropped."""
    count = len(_RESIDENT)
    _RESIDENT.clear()
    import gc

    gc.collect()
    return count


def answers_per_version(settings: dict[str, Any]) -> int:
    """The answers one version's evaluation samples: a greedy one (if ``greedy``) and ``n_samples`` per question."""
    return settings["n_questions"] * (int(settings["greedy"]) + settings["n_samples"])


class EvaluationBar:
    """The evaluate flow's console bar (:func:`~runtime.console.progress_bar`): the answers of every version to
    evaluate, with rate and ETA; :meth:`for_version` is the :data:`~llmrl_core.evaluation.gsm8k_eval.Progress`
    callback of one version, :meth:`reused` takes a version that needed no sampling off the total."""

    def __init__(self, run_id: str, versions: list[int], per_version: int, enabled: bool = True) -> None:
        self.versions, self.per_version = list(versions), per_version
        self.bar = progress_bar(len(self.versions) * per_version, f"evaluate {run_id}", "answer", enabled=enabled)
        self.base = 0  # the answers of the versions before the current one

    def for_version(self, version: int) -> Progress | None:
        """The callback of ``version``'s evaluation (``None`` without a bar): it moves the bar to that version's
        answers done (a retry of the version starts it from its first answer again)."""
        if self.bar is None:
            return None
        bar, base = self.bar, self.base
        position = f"version {version} ({self.versions.index(version) + 1}/{len(self.versions)})"

        def report(done: int, total: int) -> None:
            bar.set_postfix_str(position, refresh=False)
            bar.update(base + done - bar.n)

        return report

    def finished(self, version: int, reused: bool) -> None:
        """``version`` is done: the bar moves past it (``reused``: its answers leave the total)."""
        if self.bar is None:
            return
        if reused:
            self.bar.total -= self.per_version
            self.bar.refresh()
        else:
            self.base += self.per_version
            self.bar.update(self.base - self.bar.n)

    def close(self) -> None:
        """Close the bar (on every way out of the flow)."""
        if self.bar is not None:
            self.bar.close()


def base_weights_id(model: str | None) -> str:
    """Identity of the base model's weights: its resolved folder."""
    return f"base:{resolve_model(model)}"


def run_exists(run_id: str, runs_dir: str | None) -> bool:
    """Whether ``run_id`` has a run folder with a stored config or checkpoints under the runs root."""
    layout = RunLayout.for_runs_dir(run_id, runs_dir)
    return (layout.run_dir / "config.json").is_file() or bool(CheckpointStore(layout.checkpoints_uri).versions())


def check_run_exists(run_id: str, runs_dir: str | None) -> None:
    """A :class:`~llmrl_core.pipeline.preflight.PreflightError` naming the runs root when ``run_id`` has no run
    there (:func:`run_exists`)."""
    if not run_exists(run_id, runs_dir):
        raise PreflightError(f"run_id: no run {run_id!r} under {runs_dir or default_runs_root()}")


def run_logs(run_id: str, runs_dir: str | None) -> Any:
    """The libraries' logs (vLLM's, ...) into the run's ``logs/`` for a ``with`` block (``-v``: on the console)."""
    return library_logs(RunLayout.for_runs_dir(run_id, runs_dir).run_dir)


def run_env(run_id: str, runs_dir: str | None) -> dict[str, Any]:
    """The ``env`` section a run trained with (``RUN/config.json``; ``{}`` — GSM8K-style — for older runs)."""
    layout = RunLayout.for_runs_dir(run_id, runs_dir)
    path = layout.run_dir / "config.json"
    if not path.is_file():
        return {}
    return dict(json.loads(path.read_text()).get("env") or {})


def env_scoring(env: dict[str, Any]) -> str:
    """How an env's versions are scored: ``single_turn`` (gsm8k/arithmetic answer tags, one engine batch),
    ``ifeval`` (IFEval's four metrics), ``episode`` (tools, games, factories: every turn played in the env), or
    ``agent`` (``env.agent``: the agent plays every row against the engine's OpenAI endpoint)."""
    if env.get("agent"):
        return "agent"
    if env.get("factory"):
        return "episode"
    name = str(env.get("name", "gsm8k"))
    extras = env.get("transforms") or env.get("rewards") or env.get("max_turns") not in (None, 1)
    if name in ("gsm8k", "arithmetic") and not extras:
        return "single_turn"
    if name == "ifeval" and not extras:
        return "ifeval"
    return "episode"


def run_agent_settings(run_id: str, runs_dir: str | None) -> dict[str, Any]:
    """How a run's agent episodes ran (``rollout.agent_concurrency`` / ``agent_timeout_s`` of ``RUN/config.json``,
    or their defaults), for evaluating its agent the same way."""
    layout = RunLayout.for_runs_dir(run_id, runs_dir)
    path = layout.run_dir / "config.json"
    rollout = dict(json.loads(path.read_text()).get("rollout") or {}) if path.is_file() else {}
    return {
        "agent_concurrency": int(rollout.get("agent_concurrency", 8)),
        "agent_timeout_s": float(rollout.get("agent_timeout_s", 120.0)),
    }


def run_task(run_id: str, runs_dir: str | None, overrides: dict[str, Any] | None = None) -> TaskConfig:
    """The task a run trained on (``task`` of ``RUN/config.json``; the GSM8K defaults when the run has none),
    with ``overrides`` applied."""
    layout = RunLayout.for_runs_dir(run_id, runs_dir)
    path = layout.run_dir / "config.json"
    stored: dict[str, Any] = {}
    if path.is_file():
        try:
            stored = dict(json.loads(path.read_text()).get("task") or {})
        except (json.JSONDecodeError, AttributeError) as err:
            raise ValueError(f"{path}: not a run config ({err})") from err
    return TaskConfig.from_dict({**stored, **(overrides or {})})


def evaluation_dir(run_id: str, runs_dir: str | None, settings: dict[str, Any]) -> Path:
    """``RUN/evaluations/<first 12 hex of the settings hash>``."""
    layout = RunLayout.for_runs_dir(run_id, runs_dir)
    return layout.run_dir / "evaluations" / config_hash(settings)[:12]


def _store(run_id: str, runs_dir: str | None) -> CheckpointStore:
    layout = RunLayout.for_runs_dir(run_id, runs_dir)
    return CheckpointStore(layout.checkpoints_uri)


@task(name="resolve-eval-versions")
def resolve_versions(run_id: str, runs_dir: str | None, versions: list[int] | str = "all") -> list[int]:
    """The versions to evaluate: ``"all"`` is 0 (the base model) plus every stored version, ascending; a list
    keeps its order (duplicates dropped)."""
    stored = _store(run_id, runs_dir).versions()
    if versions == "all":
        return sorted({0, *stored})
    if isinstance(versions, str):
        raise ValueError(f"versions must be a list of ints or 'all', got {versions!r}")
    wanted = list(dict.fromkeys(int(v) for v in versions))
    missing = [v for v in wanted if v != 0 and v not in stored]
    if missing:
        raise ValueError(f"run {run_id!r} has no checkpoint for version(s) {missing} (stored: {stored})")
    return wanted


@task(name="evaluate-version", retries=1, retry_delay_seconds=5, cache_policy=NO_CACHE)  # reuse: the result files
def evaluate_version(
    run_id: str, runs_dir: str | None, version: int, settings: dict[str, Any], progress: Progress | None = None
) -> dict[str, Any]:
    """Score one version on the settings' held-out questions; writes its result JSON, returns its path and summary.
    ``progress`` gets (answers done, answers of the version) as the engine calls finish."""
    logger = get_run_logger()
    out_dir = evaluation_dir(run_id, runs_dir, settings)
    store = _store(run_id, runs_dir)
    stored = version in store.versions()
    if not stored and version != 0:
        raise ValueError(f"run {run_id!r} has no checkpoint for version {version} in {store.root}")
    weights_id = store.manifest(version).sha256 if stored else base_weights_id(settings["model"])
    path = out_dir / f"version_{version:06d}.json"
    if path.is_file():
        previous = load_result(path)
        if previous.settings.get("weights_id") == weights_id:
            logger.info("version %s: reusing %s", version, path)
            return {"version": version, "path": str(path), "summary": previous.summary(), "reused": True}
    resident = resident_worker(engine_config_for(settings))
    worker: vLLMWorker = resident["worker"]
    if resident["weights"] != weights_id:
        state = store.load(version).state_dict if stored else base_state_dict(settings["model"])
        worker.load_weights(state, version)
        resident["weights"] = weights_id
    worker.policy_version = version
    scoring = settings.get("scoring", "ifeval" if settings.get("env") == "ifeval" else "single_turn")
    rows = question_rows(settings)
    if len(rows) < settings["n_questions"]:
        raise ValueError(
            f"{settings['source']}: {len(rows)} questions, fewer than n_questions={settings['n_questions']}"
        )
    task = TaskConfig.from_dict(settings["task"])
    sampling = SamplingConfig(
        max_new_tokens=settings["max_new_tokens"],
        temperature=settings["temperature"],
        top_p=settings["top_p"],
        seed=settings["seed"],
    )
    if scoring == "agent":
        result = _evaluate_agent(resident, rows, settings, sampling, progress)
    elif scoring == "episode":
        result = _evaluate_episodes(worker, rows, settings, task, sampling, progress)
    elif scoring == "ifeval":
        result = evaluate_ifeval(
            worker,
            rows,
            settings["n_samples"],
            settings["k_values"],
            sampling,
            greedy=settings["greedy"],
            progress=progress,
        )
    else:
        result = evaluate_gsm8k(
            worker,
            rows,
            n_samples=settings["n_samples"],
            k_values=settings["k_values"],
            sampling=sampling,
            greedy=settings["greedy"],
            system_prompt=task.system_prompt,
            question_template=task.question_template,
            few_shot=task.few_shot,
            format_reward=task.format_reward,
            correct_reward=task.correct_reward,
            task=settings["source"],
            progress=progress,
        )
    result.settings.update(
        {"run_id": run_id, "policy_version": version, "weights_id": weights_id, "source": settings["source"]}
    )
    save_result(result, path)
    summary = result.summary()
    logger.info(
        "version %s: %s", version, ", ".join(f"{k}={v:.3f}" for k, v in summary.items() if k.endswith("accuracy"))
    )
    return {"version": version, "path": str(path), "summary": summary, "reused": False}


def _evaluate_agent(
    resident: dict[str, Any],
    rows: list[dict[str, Any]],
    settings: dict[str, Any],
    sampling: SamplingConfig,
    progress: Progress | None = None,
) -> Any:
    """Play every held-out row with the run's agent (``env.agent``) against the endpoint of the resident engine,
    with the evaluation's sampling imposed."""
    from llmrl_core.evaluation.agent_eval import evaluate_agent

    worker: vLLMWorker = resident["worker"]
    if resident.get("agent_tokenizer") is None:  # the endpoint's own copy: vLLM's engine thread uses the engine's
        from transformers import AutoTokenizer

        resident["agent_tokenizer"] = AutoTokenizer.from_pretrained(str(resolve_model(worker.config.model)))
    env = settings["env"]
    return evaluate_agent(
        worker,
        env["agent"],
        rows,
        settings["n_samples"],
        settings["k_values"],
        sampling,
        tokenizer=resident["agent_tokenizer"],
        greedy=settings["greedy"],
        prompt_field=env.get("prompt_field", "question"),
        concurrency=settings.get("agent_concurrency", 8),
        timeout_s=settings.get("agent_timeout_s", 120.0),
        settings={"task": settings["source"], "env": env},
        progress=progress,
    )


def _evaluate_episodes(
    worker: vLLMWorker,
    rows: list[dict[str, Any]],
    settings: dict[str, Any],
    task: TaskConfig,
    sampling: SamplingConfig,
    progress: Progress | None = None,
) -> Any:
    """Play every held-out row in the run's own env (tools and games included), built as a rollout worker does."""
    from llmrl_core.evaluation.env_eval import evaluate_env
    from llmrl_core.pipeline.config_io import build
    from llmrl_core.pipeline.env_config import EnvConfig, build_env

    env_cfg = build(EnvConfig, settings["env"], "env")
    env = build_env(env_cfg, task, worker.get_tokenizer(), input_mode="tokens")
    try:
        return evaluate_env(
            worker,
            env,
            rows,
            settings["n_samples"],
            settings["k_values"],
            sampling,
            greedy=settings["greedy"],
            prompt_field=env_cfg.prompt_field,
            settings={"task": settings["source"], "env": settings["env"]},
            progress=progress,
        )
    finally:
        env.close()


@task(name="write-eval-report")
def write_report(
    result_paths: dict[int, str], out_dir: str, title: str = "", questions: list[str] | None = None
) -> dict[str, Any]:
    """Build the table (markdown + JSON), the curve PNG and the versions' answers side by side (``questions``: the
    held-out questions' texts, by index) from the versions' result files."""
    results = {int(v): load_result(p) for v, p in result_paths.items()}
    rows = report_rows(results)
    answers = side_by_side(results, questions or [])
    folder = Path(out_dir)
    table = markdown_table(rows)
    verdict = "".join(f"- {line}\n" for line in verdict_lines(rows))
    md = write_text_atomic(folder / "report.md", f"# {title or 'Evaluation'}\n\n{verdict}\n{table}")
    js = write_text_atomic(folder / "report.json", json.dumps(rows, indent=1, allow_nan=True))
    png = plot_curves(rows, folder / "curves.png", title=title)
    answers_path = write_text_atomic(folder / "side_by_side.json", json.dumps(answers, indent=1, ensure_ascii=False))
    return {
        "rows": rows,
        "markdown": str(md),
        "json": str(js),
        "png": str(png),
        "table": table,
        "verdict": verdict,
        "side_by_side": answers,
        "side_by_side_json": str(answers_path),
    }


@task(name="publish-eval-artifacts")
def publish_artifacts(report: dict[str, Any], key: str, description: str) -> dict[str, str]:
    """The report as Prefect artifacts: a table, the curve PNG (inline data URL) and a markdown summary."""
    key = artifact_key(key) or "evaluation"
    table_id = create_table_artifact(format_rows(report["rows"]), key=f"{key}-table", description=description)
    png = base64.b64encode(Path(report["png"]).read_bytes()).decode()
    image_id = create_image_artifact(f"data:image/png;base64,{png}", key=f"{key}-curves", description=description)
    md_id = create_markdown_artifact(
        f"{description}\n\n{report.get('verdict', '')}\n{report['table']}\n"
        f"Files: `{report['markdown']}`, `{report['png']}`",
        key=f"{key}-report",
        description=description,
    )
    ids = {"table": str(table_id), "image": str(image_id), "markdown": str(md_id)}
    if report.get("side_by_side"):
        ids["side_by_side"] = str(
            create_table_artifact(
                report["side_by_side"],
                key=f"{key}-side-by-side",
                description=f"{description}: the same questions answered by each version (greedy)",
            )
        )
    return ids


@task(name="log-eval-to-mlflow")
def log_to_mlflow(
    run_id: str,
    runs_dir: str | None,
    settings: dict[str, Any],
    report: dict[str, Any],
    result_paths: dict[int, str],
    tracking_uri: str | None = None,
) -> dict[str, str]:
    """Metrics per version (step = version) and the report files in an MLflow run of the ``evaluate`` experiment."""
    from storage.lineage import LineageConfig, LineageRecorder

    layout = RunLayout.for_runs_dir(run_id, runs_dir)
    eval_id = f"{run_id}-eval-{config_hash(settings)[:12]}"
    with LineageRecorder(
        layout.run_dir,
        pipeline="evaluate",
        run_id=eval_id,
        config=settings,
        lineage_config=LineageConfig(tracking_uri=tracking_uri),
    ) as rec:
        rec.client.set_tag(rec.mlflow_run_id, "llmrl_evaluated_run_id", run_id)
        for row in report["rows"]:
            metrics = {
                f"{row['mode']}/{k}": float(v)
                for k, v in row.items()
                if k not in ("version", "mode") and isinstance(v, int | float) and v == v and abs(v) != float("inf")
            }
            rec.log_metrics(int(row["version"]), metrics)
        for name in ("markdown", "json", "png", "side_by_side_json"):
            if report.get(name):
                rec.client.log_artifact(rec.mlflow_run_id, report[name], "report")
        for path in result_paths.values():
            rec.client.log_artifact(rec.mlflow_run_id, path, "results")
        return {"tracking_uri": rec.tracking_uri, "mlflow_run_id": rec.mlflow_run_id, "experiment": "evaluate"}
