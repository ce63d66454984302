"""Reading JSON Lines files: the one reader behind the shipped datasets, IFEval and users' ``.jsonl`` prompt files."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def iter_jsonl(path: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """``("FILE:LINE", row)`` for each non-blank line of ``path``; a line that is not a JSON object is a
    ``ValueError`` naming its file and line."""
    path = Path(path)
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({err.msg})") from err
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            yield f"{path}:{lineno}", row
