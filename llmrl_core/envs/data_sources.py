"""Prompt sources for ``DataLoadingPrimer``: a Hugging Face ``datasets.Dataset``, a local jsonl/parquet file,
or any finite iterable of dict rows.

Sized, indexable sources (``datasets.Dataset``, lists) are read row by row on demand; files are read once;
other iterables are materialised into a list once, so shuffling and resuming work the same for all.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any


class RowSource:
    """Random access to dict rows with clear errors naming the source and row."""

    def __init__(self, rows: Sequence[Any], name: str) -> None:
        self._rows = rows
        self.name = name

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        row = self._rows[index]
        if not isinstance(row, dict):
            raise TypeError(f"{self.name}: row {index} is a {type(row).__name__}, expected a dict of fields")
        return dict(row)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
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
            rows.append(row)
    return rows


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except Exception as err:  # pyarrow raises several error types for corrupt files
        raise ValueError(f"{path}: cannot read as parquet ({err})") from err


def open_source(source: Any) -> RowSource:
    """Wrap ``source`` (Dataset, path to .jsonl/.json/.parquet, or iterable of dicts) as a :class:`RowSource`."""
    if isinstance(source, RowSource):
        return source
    if isinstance(source, str | Path):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"prompt source {path} does not exist (expected a .jsonl or .parquet file)")
        suffix = path.suffix.lower()
        if suffix in (".jsonl", ".json"):
            return RowSource(_read_jsonl(path), str(path))
        if suffix == ".parquet":
            return RowSource(_read_parquet(path), str(path))
        raise ValueError(f"prompt source {path}: unsupported file type {suffix!r} (use .jsonl or .parquet)")
    if type(source).__name__ == "DatasetDict":
        raise ValueError(f"got a DatasetDict with splits {list(source)}: pass one split, e.g. ds['train']")
    if type(source).__name__ == "IterableDataset":
        return RowSource(list(source), "IterableDataset")
    if hasattr(source, "__len__") and hasattr(source, "__getitem__") and not isinstance(source, dict):
        return RowSource(source, type(source).__name__)
    if isinstance(source, Iterable):
        return RowSource(list(source), type(source).__name__)
    raise TypeError(f"unsupported prompt source type {type(source).__name__}")
