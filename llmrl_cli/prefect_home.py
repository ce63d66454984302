"""One Prefect home for every llmrl command, so the runs started with ``llmrl run`` show in ``llmrl ui``.

Without this, each ``llmrl run`` would record into an ephemeral Prefect API over Prefect's default home
(``~/.prefect``), a database no UI serves. Here:

- ``PREFECT_HOME`` defaults to ``$LLMRL_HOME/prefect`` (the database ``llmrl ui`` serves);
- when ``llmrl ui`` is up (it leaves its addresses in ``$LLMRL_HOME/ui.json``), commands talk to its server
  (``PREFECT_API_URL``), so a run shows live in the UI; otherwise they start Prefect's ephemeral API over
  the same home, and the runs show the next time the UI starts.

A ``PREFECT_HOME`` or ``PREFECT_API_URL`` the user set wins. Call :func:`use_llmrl_prefect` before Prefect
is imported (its settings are read at import).
"""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path
from typing import Any

from llmrl_core.paths import llmrl_home

QUIET_PREFECT = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",  # no telemetry calls (they fail offline, with an error)
    "DO_NOT_TRACK": "true",
    # an ephemeral API can need more than the 20 s default on a busy 2-core machine
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
}


def prefect_home() -> Path:
    """Where llmrl's Prefect database and profiles live: ``$LLMRL_HOME/prefect``."""
    return llmrl_home() / "prefect"


def ui_state_file() -> Path:
    """The file in which a running ``llmrl ui`` leaves its addresses and process id."""
    return llmrl_home() / "ui.json"


def running_ui(timeout_s: float = 2.0) -> dict[str, Any] | None:
    """The addresses of a running ``llmrl ui`` (``prefect_api_url``, ``prefect_ui_url``, ``mlflow_url``), if its
    Prefect API answers; ``None`` when no UI is up (a stale state file is ignored)."""
    try:
        state = json.loads(ui_state_file().read_text())
        with urllib.request.urlopen(f"{state['prefect_api_url']}/health", timeout=timeout_s) as reply:
            return state if reply.status == 200 else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def use_llmrl_prefect() -> str:
    """Set the Prefect environment of this process (see the module docstring); returns where runs are recorded."""
    for key, value in QUIET_PREFECT.items():
        os.environ.setdefault(key, value)
    if os.environ.get("PREFECT_API_URL"):
        return os.environ["PREFECT_API_URL"]
    os.environ.setdefault("PREFECT_HOME", str(prefect_home()))
    Path(os.environ["PREFECT_HOME"]).expanduser().mkdir(parents=True, exist_ok=True)  # Prefect makes the leaf only
    ui = running_ui()
    if ui is not None:
        os.environ["PREFECT_API_URL"] = ui["prefect_api_url"]
        return ui["prefect_api_url"]
    return f"ephemeral Prefect API over {os.environ['PREFECT_HOME']}"
