"""Entry point of the ``llmrl`` command (``llmrl --help``)."""

from __future__ import annotations

import typer

from llmrl_cli.config_cmd import config_app
from llmrl_cli.demo import demo
from llmrl_cli.docs_cmd import docs
from llmrl_cli.doctor import doctor
from llmrl_cli.lineage import lineage
from llmrl_cli.models import models_app
from llmrl_cli.plan import plan
from llmrl_cli.run import run_app
from llmrl_cli.run_more import run_offline, run_sft
from llmrl_cli.trajectories import trajectories_app
from llmrl_cli.ui import ui

app = typer.Typer(
    name="llmrl",
    help="LLM post-training (GRPO / SFT) as an orchestrated dataflow.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(models_app, name="models")
app.add_typer(trajectories_app, name="trajectories")
run_app.command("sft")(run_sft)
run_app.command("offline")(run_offline)
app.add_typer(run_app, name="run")
app.add_typer(config_app, name="config")
app.command("lineage")(lineage)
app.command("doctor")(doctor)
app.command("demo")(demo)
app.command("ui")(ui)
app.command("plan")(plan)
app.command("docs")(docs)


@app.command("version")
def version() -> None:
    """Print the llmrl version."""
    from llmrl_core import __version__

    typer.echo(f"llmrl {__version__}")


if __name__ == "__main__":
    app()
