"""Running the ``llmrl`` command line from a test: in a subprocess of this interpreter, from the checkout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_llmrl(
    *args: str, settings: list[str] = (), env: dict[str, str] | None = None, timeout: float = 900
) -> subprocess.CompletedProcess:
    """``llmrl ARGS --set S ...`` (each of ``settings``), its output captured as text; ``env``: the process's
    environment (default: this one's)."""
    command = [sys.executable, "-c", "from llmrl_cli.main import app; app()", *args]
    command += [a for s in settings for a in ("--set", s)]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
