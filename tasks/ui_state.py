"""Where a running ``llmrl ui`` leaves its addresses (``<LLMRL_HOME>/ui.json``), and how to find it alive.

The CLI writes the file when ``llmrl ui`` starts; flows read it to point their links at the UI that is up.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

from llmrl_core.paths import llmrl_home


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
