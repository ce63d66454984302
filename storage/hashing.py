"""Stable hashes for lineage: a configuration's hash and a local file's sha256."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any


def _plain(value: Any) -> Any:
    """Turn dataclasses, enums, paths and datetimes into JSON-ready values (dict keys become strings)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted(_plain(v) for v in value)
    if isinstance(value, enum.Enum):
        return _plain(value.value)
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"cannot hash a config value of type {type(value).__name__}: {value!r:.100}")


def canonical_json(config: Any) -> str:
    """Canonical JSON text of a configuration: sorted keys, no whitespace, plain types only."""
    return json.dumps(_plain(config), sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=False)


def config_hash(config: Any) -> str:
    """sha256 of the canonical JSON of a configuration (mapping or dataclass); key order does not matter."""
    return hashlib.sha256(canonical_json(config).encode()).hexdigest()


def file_sha256(path: str | os.PathLike[str], chunk: int = 1 << 22) -> str:
    """Hex sha256 of a local file, streamed."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()
