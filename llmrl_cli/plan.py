"""``llmrl plan``: the memory plan of a GRPO configuration on this host, before anything starts."""

from __future__ import annotations

from pathlib import Path

import typer


def plan(
    config: Path = typer.Option(None, "--config", "-c", help="YAML config (default: the main job)."),
    overrides: list[str] = typer.Option(None, "--set", help="Override one setting, e.g. --set train.token_budget=512."),
) -> None:
    """Per device: the bytes of the trainer's weights, gradients, optimizer state and activations, the reference
    model, and each engine's weights and KV cache (each with its rule); exits 1 when the plan does not fit."""
    from llmrl_cli.run import MAIN_JOB
    from llmrl_cli.run_more import load_checked
    from llmrl_core.memory_plan import render
    from llmrl_core.pipeline.grpo_config import GRPOConfig
    from runtime.memory_check import plan_run

    cfg = load_checked(GRPOConfig, config or MAIN_JOB, overrides, False, placement=False)  # the plan says what fits
    try:
        result = plan_run(cfg)
    except ValueError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from err
    n = result.shape.parameters()
    typer.echo(f"model {cfg.model or 'default'}: {n:,} parameters")
    typer.echo(render(result.lines, result.capacity))
    for problem in result.problems:
        typer.echo(f"does not fit: {problem}", err=True)
    if result.problems:
        raise typer.Exit(1)
