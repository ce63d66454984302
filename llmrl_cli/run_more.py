"""``llmrl run sft`` and ``llmrl run offline``: the SFT and offline-GRPO flows with a YAML config and ``--set``.

Register them on ``run_app`` (llmrl_cli/run.py): ``run_app.command("sft")(run_sft)`` and
``run_app.command("offline")(run_offline)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

VERBOSE_OPTION = typer.Option(
    False, "--verbose", "-v", help="Show the libraries' logs (Dask, vLLM, MLflow, Prefect tasks) here, live."
)


def run_flow(flow: Any, **parameters: Any) -> Any:
    """Call a flow; a run stopped by Ctrl-C or SIGTERM is marked Cancelled in Prefect (MLflow: KILLED) on its way
    out, instead of Crashed; a failing reward function or a lost worker ends it with one line (exit 1), not a
    traceback."""
    from llmrl_cli.run_api import run_api
    from llmrl_core.envs.reward_calls import RewardFunctionError
    from llmrl_core.user_code import UserCodeError
    from runtime.actor_calls import WorkerLost
    from runtime.console import flow_echoes_dropped
    from storage.lineage import LineageError
    from tasks.grpo_stages import AgreementOff

    with run_api():  # the run's own Prefect API (unless a UI server is up), stopped after the run records its end
        try:
            with flow_echoes_dropped():
                return flow(**parameters)
        except RewardFunctionError as err:  # the user's reward code failed: its line says which function and row
            typer.echo(f"error: {err}\n(set env.reward_errors=skip to fail such episodes alone and go on)", err=True)
            raise typer.Exit(1) from err
        except UserCodeError as err:  # an env factory, transform or agent failed on a rollout worker: its line says so
            typer.echo(f"error: {err}\n(its traceback: the rollout worker's log in the run's logs/ folder)", err=True)
            raise typer.Exit(1) from err
        except WorkerLost as err:  # its line names the worker, the stage and the version
            typer.echo(f"error: {err}\n(committed versions are kept: the same command again resumes)", err=True)
            raise typer.Exit(1) from err
        except AgreementOff as err:  # its line gives the gap, the bound and the version kept
            typer.echo(f"error: {err}\n(set train.agreement_stop=false to only warn and go on)", err=True)
            raise typer.Exit(1) from err
        except LineageError as err:  # a resume with other settings than the run's versions were made with
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(2) from err
        except (KeyboardInterrupt, SystemExit) as stop:
            from tasks.run_identity import mark_stopped

            how = "SIGTERM" if isinstance(stop, SystemExit) else "Ctrl-C"
            mark_stopped(f"stopped by {how}")  # a stop before the flow marked it itself
            typer.echo(
                f"stopped by {how}: published versions are kept (Prefect: Cancelled, MLflow: KILLED); the same "
                "command resumes after the last one",
                err=True,
            )
            raise


def set_verbose(verbose: bool) -> None:
    """``-v``: the libraries log to the console (runtime/console.py); otherwise to files under the run folder."""
    import os

    from runtime.console import VERBOSE

    if verbose:
        os.environ[VERBOSE] = "1"


def load_checked(
    config_cls: type,
    config: Path | None,
    overrides: list[str] | None,
    show_config: bool,
    training: bool = True,
    placement: bool = True,
) -> Any:
    """The run config, loaded and pre-flight checked (a bad setting exits 2 with its message before any flow,
    server, cluster or engine starts); None when ``--show-config`` printed it. ``placement``: also check the local
    cluster the run would start (:func:`check_placement`)."""
    from llmrl_core.pipeline.config_io import ConfigError, load_config, to_dict
    from llmrl_core.pipeline.preflight import PreflightError, preflight
    from storage.layout import RunLayout
    from storage.run_lock import RunBusyError, check_not_busy

    try:
        cfg = load_config(config_cls, config, overrides or [])
        if not show_config:
            preflight(cfg, training=training)
            if training:
                from tasks.fork import check_fork

                check_fork(cfg)  # init.from: the source run, version and checkpoint exist
                check_not_busy(RunLayout.for_runs_dir(cfg.run_id, cfg.runs_dir).run_dir, cfg.run_id)
                check_resume_config(cfg)
            if placement:
                check_placement(cfg)
            check_trajectory_source(cfg)
    except (ConfigError, PreflightError, ValueError, RunBusyError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from err
    if show_config:
        import yaml

        typer.echo(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        return None
    return cfg


def check_trajectory_source(cfg: Any) -> None:
    """An SFT run on trajectories, or an offline run: the source run's chosen versions are stored (else a
    ``ValueError`` naming the run and the store, before any flow or worker starts)."""
    from llmrl_core.pipeline.offline_config import OfflineConfig
    from llmrl_core.pipeline.sft_config import SFTConfig
    from storage.layout import RunLayout
    from storage.trajectories import TrajectoryStore

    if isinstance(cfg, SFTConfig) and cfg.source == "trajectories":
        source = cfg.trajectories
    elif isinstance(cfg, OfflineConfig):
        source = cfg.source
    else:
        return
    uri = source.store or RunLayout.for_runs_dir(cfg.run_id, cfg.runs_dir).trajectories_uri
    TrajectoryStore(uri).chosen_versions(source.run_id, source.versions)


def check_placement(cfg: Any) -> None:
    """GPUs, threads, the weight route and the memory plan of the local cluster a GRPO run starts (a setting that
    cannot work there is refused here, in one line, rather than as the flow's traceback once its API started);
    a joined cluster's workers are checked when the run meets them."""
    from llmrl_core.pipeline.grpo_config import GRPOConfig

    if isinstance(cfg, GRPOConfig) and not cfg.dask.address:
        from runtime.memory_check import check_local_placement

        check_local_placement(cfg, warn=False)


def check_resume_config(cfg: Any) -> None:
    """A resume that would change a setting the run's versions were made with is refused here, naming the
    settings (the flow itself would refuse it at its lineage check, after its Prefect API started)."""
    from llmrl_core.pipeline.grpo_config import GRPOConfig
    from storage.checkpoints import CheckpointError, CheckpointStore
    from storage.layout import RunLayout
    from tasks.commits import check_unchanged_config, latest_published

    if isinstance(cfg, GRPOConfig):
        from tasks.grpo_stages import lineage_config
    else:
        from tasks.epoch_stages import lineage_config
    layout = RunLayout.for_runs_dir(cfg.run_id, cfg.runs_dir)
    check_unchanged_config(cfg.run_id, layout.run_dir, lineage_config(cfg))
    published = latest_published(layout.run_dir)
    if published is not None:  # the checkpoint the resume loads, whole (else found after the workers loaded)
        try:
            CheckpointStore(layout.checkpoints_uri).verify(published[0])
        except CheckpointError as err:
            raise ValueError(f"resuming run {cfg.run_id!r} at version {published[0]}: {err}") from err


def _print_summary(summary: dict[str, Any]) -> None:
    typer.echo(f"run {summary['run_id']}: published version {summary['published_version']}")
    typer.echo(f"  training set: {summary['samples']}")
    typer.echo(f"  checkpoints:  {summary['checkpoints']}")
    typer.echo(f"  MLflow:       {summary['mlflow_tracking_uri']}  (llmrl lineage {summary['run_id']} --version 1)")
    typer.echo("  in the UIs:   llmrl ui  (Prefect: this run and its artifacts; MLflow: every run)")


def run_sft(
    config: Path = typer.Option(
        None, "--config", "-c", help="YAML config (sections: data, trajectories, train, dask)."
    ),
    overrides: list[str] = typer.Option(
        None, "--set", help="Override one setting, e.g. --set epochs=2 or --set source=trajectories."
    ),
    show_config: bool = typer.Option(False, "--show-config", help="Print the resolved config and exit."),
    verbose: bool = VERBOSE_OPTION,
) -> None:
    """SFT on GSM8K chats (default) or a chat dataset; with --set source=trajectories --set trajectories.run_id=R,
    on the best stored responses of run R (top-k per prompt group).

    One policy version per epoch; running the same run_id again resumes after its last published epoch.
    """
    from llmrl_core.pipeline.sft_config import SFTConfig

    set_verbose(verbose)
    cfg = load_checked(SFTConfig, config, overrides, show_config)
    if cfg is None:
        return
    from flows.sft import sft

    summary = run_flow(sft, config=str(config) if config else None, overrides=list(overrides or []))
    _print_summary(summary)
    losses = ", ".join(f"v{v} {loss:.4f}" for v, loss in summary["data_loss"].items() if loss is not None)
    typer.echo(f"  loss on the training set: {losses}")


def run_offline(
    config: Path = typer.Option(None, "--config", "-c", help="YAML config (sections: source, rescore, train, dask)."),
    overrides: list[str] = typer.Option(
        None, "--set", help="Override one setting, e.g. --set source.run_id=grpo-demo --set rescore.reward=gsm8k."
    ),
    show_config: bool = typer.Option(False, "--show-config", help="Print the resolved config and exit."),
    verbose: bool = VERBOSE_OPTION,
) -> None:
    """GRPO from the stored trajectories of another run (no new rollouts), optionally re-scored, into a new run.

    Rewards: stored (as recorded), gsm8k, gsm8k_strict (no format bonus), brevity.
    """
    from llmrl_core.pipeline.offline_config import OfflineConfig

    cfg = load_checked(OfflineConfig, config, overrides, show_config)
    if cfg is None:
        return
    from flows.offline import offline

    summary = run_flow(offline, config=str(config) if config else None, overrides=list(overrides or []))
    _print_summary(summary)
    typer.echo(
        f"  from {summary['source_run_id']} versions {summary['versions']}: {summary['trained_rows']} of "
        f"{summary['rows']} rows trained on, mean reward {summary['stored_reward_mean']:.3f} stored, "
        f"{summary['reward_mean']:.3f} re-scored ({summary['rescored']})"
    )
