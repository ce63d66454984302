"""``llmrl models ...``: prepare, verify and locate the embedded default model."""

from __future__ import annotations

import typer

from llmrl_core import model_store

models_app = typer.Typer(help="Prepare and inspect the embedded default model.", no_args_is_help=True)


@models_app.command("prepare")
def prepare(
    force: bool = typer.Option(False, "--force", help="Rebuild even if a valid folder exists."),
) -> None:
    """Convert the packaged SmolLM2-135M-Instruct GGUF into a Hugging Face folder under $LLMRL_HOME.

    Runs once; afterwards it only re-verifies the checksums. Safe to run again or concurrently.
    """
    try:
        result = model_store.prepare_default_model(force=force, progress=lambda m: typer.echo(f"  {m}"))
    except model_store.ModelPreparationError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from err
    typer.echo(f"{'prepared' if result.created else 'already prepared'}: {result.path}")


@models_app.command("verify")
def verify() -> None:
    """Recompute the checksums of the prepared default model against its manifest."""
    target = model_store.default_model_dir()
    if not target.exists():
        typer.echo(f"not prepared yet: {target} (run `llmrl models prepare`)", err=True)
        raise typer.Exit(1)
    problems = model_store.verify_model_dir(target, full=True)
    for problem in problems:
        typer.echo(f"  {problem}", err=True)
    if problems:
        raise typer.Exit(1)
    typer.echo(f"ok: {target}")


@models_app.command("path")
def path(
    model: str = typer.Argument("default", help="'default', a local folder or a Hugging Face id."),
) -> None:
    """Print where a model reference resolves to (preparing the default model if needed)."""
    from llmrl_core.pipeline.preflight import PreflightError, check_model

    try:
        check_model(model, "model")
    except PreflightError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from err
    typer.echo(model_store.resolve_model(model, progress=lambda m: typer.echo(f"  {m}", err=True)))
