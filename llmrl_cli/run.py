"""``llmrl run FLOW``: run a pipeline flow with a YAML config and ``--set section.key=value`` overrides."""

from __future__ import annotations

from pathlib import Path

import typer

from llmrl_cli.run_more import VERBOSE_OPTION, run_flow, set_verbose

MAIN_JOB = Path(__file__).with_name("main_job.yaml")  # what `llmrl run grpo` runs without --config

run_app = typer.Typer(
    help="Run a pipeline flow (recorded in llmrl's Prefect home and MLflow store; shown by `llmrl ui`).",
    no_args_is_help=True,
)


def stop_on_sigterm(signum: int, _frame: object) -> None:
    """SIGTERM ends a run the way Ctrl-C does: by an exception, so every context closes (Dask workers and engines,
    the MLflow run marked KILLED) and the interpreter's exit hooks stop the ephemeral Prefect API. Without it,
    Prefect marks the flow run crashed and then re-raises SIGTERM on the default handler, which ends the process
    at once and leaves the ephemeral API server running."""
    raise SystemExit(128 + signum)


@run_app.callback()
def use_one_prefect_home() -> None:
    """Record every flow run in llmrl's one Prefect home (or the running `llmrl ui` server); stop cleanly on SIGTERM."""
    import signal

    from llmrl_cli.prefect_home import use_llmrl_prefect

    use_llmrl_prefect()
    signal.signal(signal.SIGTERM, stop_on_sigterm)


def main_job_for(overrides: list[str]) -> Path:
    """The config of ``llmrl run grpo`` without ``--config``: the main job; or, when ``--set env.name=...`` names an
    env other than its arithmetic one, the main job's schedule (iterations, rollout, training, held-out evaluation)
    without its arithmetic prompts and prompt format, so that env brings its own (written under $LLMRL_HOME)."""
    import yaml

    from llmrl_core.paths import llmrl_home

    names = [o.split("=", 1)[1].strip().strip("\"'") for o in overrides if o.replace(" ", "").startswith("env.name=")]
    env = names[-1] if names else "arithmetic"
    if env == "arithmetic":
        typer.echo(
            f"no --config: the main job ({MAIN_JOB.name}: two-digit addition, 10 iterations, then a held-out "
            "evaluation); GSM8K: --config recipes/gsm8k-demo.yaml",
            err=True,
        )
        return MAIN_JOB
    settings = yaml.safe_load(MAIN_JOB.read_text())
    settings.pop("task", None)
    settings["data"].pop("source", None)
    settings["run_id"] = f"{env.replace('_', '-')}-quickstart"
    path = llmrl_home() / "configs" / f"main_job_{env}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"# {MAIN_JOB.name} without its arithmetic prompts, for env.name={env}\n" + yaml.safe_dump(settings))
    tmp.replace(path)
    typer.echo(f"no --config: the main job's schedule with env {env!r} and its own prompts ({path})", err=True)
    return path


@run_app.command("grpo")
def run_grpo(
    config: Path = typer.Option(None, "--config", "-c", help="YAML config (sections: data, rollout, train, dask)."),
    overrides: list[str] = typer.Option(None, "--set", help="Override one setting, e.g. --set train.lr=1e-6."),
    show_config: bool = typer.Option(False, "--show-config", help="Print the resolved config and exit."),
    verbose: bool = VERBOSE_OPTION,
) -> None:
    """GRPO: without --config, the main job (two-digit addition with the packaged SmolLM2-135M, 10 iterations,
    then base vs last version on 100 held-out problems); --config recipes/gsm8k-demo.yaml for GSM8K.

    Running the same run_id again resumes after its last published version.
    """
    from llmrl_cli.run_more import load_checked
    from llmrl_core.pipeline.grpo_config import GRPOConfig

    set_verbose(verbose)
    if config is None:
        config = main_job_for(list(overrides or []))
    if load_checked(GRPOConfig, config, overrides, show_config) is None:
        return
    from flows.grpo import grpo

    summary = run_flow(grpo, config=str(config), overrides=list(overrides or []))
    typer.echo(f"run {summary['run_id']}: published version {summary['published_version']}")
    if "final_eval" in summary:
        typer.echo(f"  {summary['final_eval']['line']}")
        typer.echo(f"  evaluation:   {summary['final_eval']['report']}")
    typer.echo(f"  curves:       {summary['curves']}")
    typer.echo(f"  trajectories: {summary['trajectories']}  (llmrl trajectories show {summary['run_id']} --version 0)")
    typer.echo(f"  checkpoints:  {summary['checkpoints']}")
    typer.echo(f"  MLflow:       {summary['mlflow_tracking_uri']}  (llmrl lineage {summary['run_id']} --version 1)")
    typer.echo("  in the UIs:   llmrl ui  (Prefect: this run and its artifacts; MLflow: every run)")


@run_app.command("collect")
def run_collect(
    config: Path = typer.Option(None, "--config", "-c", help="YAML config (the same sections as grpo)."),
    overrides: list[str] = typer.Option(None, "--set", help="Override one setting, e.g. --set data.group_size=8."),
    version: int = typer.Option(0, "--version", help="Policy version of the run to sample (0 = base model)."),
    batches: int = typer.Option(1, "--batches", min=1, help="How many batches of prompts."),
    out_run_id: str = typer.Option(None, "--out-run-id", help="Run id to store the rollouts under."),
    verbose: bool = VERBOSE_OPTION,
) -> None:
    """Rollouts only: sample a stored policy version and keep every response (no training)."""
    from llmrl_cli.run_more import load_checked
    from llmrl_core.pipeline.grpo_config import GRPOConfig

    set_verbose(verbose)
    cfg = load_checked(GRPOConfig, config, overrides, False, training=False)
    if out_run_id is not None:
        _check_id(out_run_id, "--out-run-id")
    from flows.collect import collect
    from tasks.collect_run import checkpoint_to_sample

    try:  # before the Prefect API and the engines start
        checkpoint_to_sample(cfg.run_id, cfg.runs_dir, version)
    except (ValueError, OSError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from err

    summary = run_flow(
        collect,
        config=str(config) if config else None,
        overrides=list(overrides or []),
        policy_version=version,
        batches=batches,
        out_run_id=out_run_id,
    )
    typer.echo(f"{summary['rows']} rollouts in {summary['partition']}")


@run_app.command("evaluate")
def run_evaluate(
    run_id: str = typer.Argument(..., help="The run whose versions to score."),
    versions: str = typer.Option("all", help="'all' or a comma list, e.g. 0,2,3 (0 = the base model)."),
    questions: int = typer.Option(100, "--questions", "-n", min=1, help="Held-out questions (the first N)."),
    source: str = typer.Option(
        None, help="Held-out prompts: gsm8k:test, arithmetic:test, a .jsonl/.parquet path (default: the run's task)."
    ),
    samples: int = typer.Option(4, "--samples", min=1, help="Sampled answers per question (pass@k)."),
    temperature: float = typer.Option(0.7, help="Sampling temperature of the sampled mode."),
    max_new_tokens: int = typer.Option(256, min=1, help="Token limit of each answer (each turn, in a tool env)."),
    runs_dir: str = typer.Option(None, help="Runs root (default $LLMRL_HOME/runs)."),
    verbose: bool = VERBOSE_OPTION,
) -> None:
    """Held-out accuracy, tag rate, mean reward and pass@k of a run's versions, greedy and sampled."""
    set_verbose(verbose)
    _check_id(run_id, "RUN_ID")
    chosen: list[int] | str = "all"
    if versions != "all":
        try:
            chosen = [int(v) for v in versions.split(",")]
        except ValueError:
            typer.echo(f"error: --versions must be 'all' or a comma list of integers (e.g. 0,2,3), got {versions!r}")
            raise typer.Exit(2) from None
    from llmrl_core.pipeline.preflight import source_rows
    from tasks.evaluate import resolve_versions, run_env, run_exists

    if not run_exists(run_id, runs_dir):
        typer.echo(f"error: no run {run_id!r} under {runs_dir or 'the runs root ($LLMRL_HOME/runs)'}", err=True)
        raise typer.Exit(2)
    try:  # before the Prefect API and the engine start
        resolve_versions.fn(run_id, runs_dir, chosen)  # the task's function: no Prefect API for a check
        if source is not None:
            source_rows(source, "--source", env_options=run_env(run_id, runs_dir).get("options"))
    except (ValueError, OSError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from err
    from flows.evaluate import evaluate

    summary = run_flow(  # the run's own Prefect API, and a Ctrl-C that stops the evaluation cleanly, as for training
        evaluate,
        run_id=run_id,
        versions=chosen,
        n_questions=questions,
        n_samples=samples,
        k_values=sorted({1, samples}),
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        runs_dir=runs_dir,
        source=source,
    )
    typer.echo(f"report: {summary['report_markdown']}\ncurves: {summary['report_png']}")


def _check_id(run_id: str, setting: str) -> None:
    from llmrl_core.pipeline.preflight import PreflightError, check_run_id

    try:
        check_run_id(run_id, setting)
    except PreflightError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from err
