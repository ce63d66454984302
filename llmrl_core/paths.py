"""Where llmrl keeps its caches: ``$LLMRL_HOME`` (default ``~/.cache/llmrl``)."""

from __future__ import annotations

import os
import re
from pathlib import Path


def llmrl_home() -> Path:
    """Root of llmrl's cache: ``$LLMRL_HOME`` if set, else ``~/.cache/llmrl``."""
    env = os.environ.get("LLMRL_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "llmrl"


def models_dir() -> Path:
    """Folder that holds prepared Hugging Face model folders."""
    return llmrl_home() / "models"


# A run id / shard name becomes a path segment: letters, digits, '.', '_', '-' (not first), at most 200 characters.
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
