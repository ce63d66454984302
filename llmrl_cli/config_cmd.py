"""``llmrl config schema FLOW`` and ``llmrl config show FLOW``: every setting of a flow's config, typed and
described (JSON schema), and the config a file plus ``--set`` overrides resolve to (YAML)."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path

import typer

config_app = typer.Typer(help="The flows' settings: their schema and a resolved config.", no_args_is_help=True)


class FlowName(StrEnum):
    """The flows with a config of their own."""

    grpo = "grpo"
    sft = "sft"
    offline = "offline"


def config_class(flow: FlowName) -> type:
    """The config dataclass of ``flow``."""
    if flow is FlowName.sft:
        from llmrl_core.pipeline.sft_config import SFTConfig

        return SFTConfig
    if flow is FlowName.offline:
        from llmrl_core.pipeline.offline_config import OfflineConfig

        return OfflineConfig
    from llmrl_core.pipeline.grpo_config import GRPOConfig

    return GRPOConfig


@config_app.command("schema")
def schema(flow: FlowName = typer.Argument(..., help="grpo, sft or offline.")) -> None:
    """Print the JSON schema of FLOW's config: every setting by section, with its type, default and description."""
    from llmrl_core.pipeline.config_io import config_schema

    typer.echo(json.dumps(config_schema(config_class(flow)), indent=2))


@config_app.command("show")
def show(
    flow: FlowName = typer.Argument(..., help="grpo, sft or offline."),
    config: Path = typer.Option(None, "--config", "-c", help="YAML config (default: the built-in defaults)."),
    overrides: list[str] = typer.Option(None, "--set", help="Override one setting, e.g. --set train.lr=1e-6."),
) -> None:
    """Print the config FLOW would run with (file, then --set), checked as `llmrl run` checks it (exit 2 on a bad
    setting)."""
    from llmrl_cli.run_more import load_checked

    load_checked(config_class(flow), config, overrides, show_config=True)
