"""``llmrl lineage RUN --version N``: which data, config, code and parent weights produced a version."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def lineage(
    run: str = typer.Argument(..., help="Run id."),
    version: int = typer.Option(None, "--version", "-v", help="Policy version (default: the latest recorded)."),
    tracking_uri: str = typer.Option(
        None, "--tracking-uri", help="MLflow tracking URI (default: the runs root's sqlite)."
    ),
    runs_dir: Path = typer.Option(None, "--runs-dir", help="Runs root (default: $LLMRL_RUNS_DIR or $LLMRL_HOME/runs)."),
    as_json: bool = typer.Option(False, "--json", help="Print the full record as JSON."),
    tree: bool = typer.Option(False, "--tree", help="Print the runs forked from RUN (init.from), as a tree."),
) -> None:
    """Show which data, config, code and parent weights produced a policy version (from MLflow)."""
    from storage.layout import RunLayout, default_runs_root

    if tree:
        _print_tree(run, runs_dir or default_runs_root())
        return
    from mlflow import MlflowClient

    from storage.lineage import LineageError, default_tracking_uri, tracking_root
    from storage.lineage_query import find_run, format_lineage, recorded_versions, version_lineage

    try:
        run_dir = RunLayout(run, runs_root=runs_dir or default_runs_root()).run_dir
        store = tracking_root(run_dir) / "mlflow.db"
        if tracking_uri is None and not store.is_file():
            raise LineageError(f"no lineage store for run {run!r}: {store} does not exist")
        uri = tracking_uri or default_tracking_uri(run_dir)
        if version is None:
            client = MlflowClient(tracking_uri=uri)
            known = recorded_versions(client, find_run(client, run))
            if not known:
                raise LineageError(f"run {run!r} has no recorded policy versions yet")
            version = known[-1]
        info = version_lineage(run, version, tracking_uri=uri)
    except (LineageError, ValueError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from err
    typer.echo(json.dumps(info, indent=2, sort_keys=True) if as_json else format_lineage(info))


def _print_tree(run: str, runs_root: Path) -> None:
    """RUN and the runs forked from it under ``runs_root``, one per line, indented by generation."""
    from tasks.fork import fork_tree

    if not (runs_root / run).is_dir():
        typer.echo(f"error: no run {run!r} under {runs_root}", err=True)
        raise typer.Exit(1)
    typer.echo(run)
    for depth, child, point in fork_tree(runs_root, run):
        typer.echo(f"{'    ' * (depth - 1)}└── {child}  (from {point})")
