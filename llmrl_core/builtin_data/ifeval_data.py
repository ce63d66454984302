"""The IFEval prompts shipped inside the package (Apache-2.0, see ``ifeval/LICENSE``, ``NOTICE``, ``SOURCE.txt``).

541 rows, each ``{"key": int, "prompt": str, "instruction_id_list": [str], "kwargs": [dict]}``, with
``kwargs[i]`` the arguments of ``instruction_id_list[i]``. This module checks the structure of each row; the
instruction ids and their kwargs are checked by ``llmrl_core.envs.ifeval`` (which knows the checkers).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmrl_core.jsonl import iter_jsonl

_ROOT = Path(__file__).resolve().parent
IFEVAL_NUM_ROWS = 541


def ifeval_path() -> Path:
    """Path of the shipped IFEval prompt file (jsonl)."""
    return _ROOT / "ifeval" / "input_data.jsonl"


def check_ifeval_row(row: Any, where: str) -> dict[str, Any]:
    """Check one row's fields and types; errors name ``where`` (e.g. ``file:line``) and the field."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    missing = {"key", "prompt", "instruction_id_list", "kwargs"} - set(row)
    if missing:
        raise ValueError(f"{where}: missing field(s) {sorted(missing)}")
    if isinstance(row["key"], bool) or not isinstance(row["key"], int):
        raise ValueError(f"{where}: field 'key' must be an integer, got {row['key']!r}")
    if not isinstance(row["prompt"], str) or not row["prompt"].strip():
        raise ValueError(f"{where}: field 'prompt' must be a non-empty string")
    ids, kwargs = row["instruction_id_list"], row["kwargs"]
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
        raise ValueError(f"{where}: field 'instruction_id_list' must be a non-empty list of strings, got {ids!r}")
    if not isinstance(kwargs, list) or not all(isinstance(k, dict) for k in kwargs):
        raise ValueError(f"{where}: field 'kwargs' must be a list of objects, got {kwargs!r}")
    if len(ids) != len(kwargs):
        raise ValueError(
            f"{where}: 'instruction_id_list' has {len(ids)} entries but 'kwargs' has {len(kwargs)}; they must match"
        )
    return {"key": row["key"], "prompt": row["prompt"], "instruction_id_list": list(ids), "kwargs": list(kwargs)}


def load_ifeval(path: str | Path | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    """Read IFEval rows (default: the shipped file) as dicts, checking every row's structure."""
    path = Path(path) if path is not None else ifeval_path()
    rows: list[dict[str, Any]] = []
    for where, row in iter_jsonl(path):
        if limit is not None and len(rows) >= limit:
            break
        rows.append(check_ifeval_row(row, where))
    return rows
