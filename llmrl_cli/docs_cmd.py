"""``llmrl docs``: the documentation site of the clone (``mkdocs.yml``, ``docs/``), served on 127.0.0.1 or built into
``site/``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import typer

ROOT = Path(__file__).resolve().parents[1]


def docs(
    port: int = typer.Option(8000, "--port", help="Port of the local server (bound to 127.0.0.1)."),
    build: bool = typer.Option(False, "--build", help="Only build the site into site/ (strict), do not serve it."),
) -> None:
    """Serve the documentation on http://127.0.0.1:PORT (mkdocs serve), or build it into site/ with --build."""
    if not (ROOT / "mkdocs.yml").is_file():
        typer.echo(f"error: no mkdocs.yml in {ROOT}: llmrl docs works from a clone of the repository", err=True)
        raise typer.Exit(2)
    try:
        import mkdocs  # noqa: F401
    except ImportError:
        typer.echo("error: mkdocs is not installed: pip install -e '.[test]' (mkdocs, mkdocs-material, mkdocstrings)")
        raise typer.Exit(2) from None
    if build:
        command = ["build", "--strict", "--site-dir", str(ROOT / "site")]
    else:
        command = ["serve", "--dev-addr", f"127.0.0.1:{port}"]
        typer.echo(f"docs: http://127.0.0.1:{port} (Ctrl-C stops)")
    try:
        code = subprocess.call([sys.executable, "-m", "mkdocs", *command], cwd=ROOT)
    except KeyboardInterrupt:
        code = 0
    raise typer.Exit(code)
