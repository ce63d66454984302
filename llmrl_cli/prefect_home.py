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

import os
from pathlib import Path

from llmrl_core.paths import llmrl_home
from tasks.ui_state import running_ui

QUIET_PREFECT = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",  # no telemetry calls (they fail offline, with an error)
    "DO_NOT_TRACK": "true",
    # an ephemeral API can need more than the 20 s default on a busy 2-core machine
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
}


def prefect_home() -> Path:
    """Where llmrl's Prefect database and profiles live: ``$LLMRL_HOME/prefect``."""
    return llmrl_home() / "prefect"


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
