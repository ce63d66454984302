"""Prompt sources for ``DataLoadingPrimer``: a Hugging Face ``datasets.Dataset``, a local jsonl/parquet file,
any finite iterable of dict rows, or an endless iterator (a stream).

Sized, indexable sources (``datasets.Dataset``, lists) are read row by row on demand; files are read once;
other finite iterables are materialised into a list once, so shuffling and resuming work the same for all.
An *iterator* (an object with ``__next__`` and no ``__len__``, e.g. TorchRL's ``DummyStrDataLoader``) may never
end, so it is read as a :class:`RowStream` instead: in its own order, item by item, when rows are needed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from llmrl_core.jsonl import iter_jsonl


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
    return [row for _, row in iter_jsonl(path)]


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except Exception as err:  # pyarrow raises several error types for corrupt files
        raise ValueError(f"{path}: cannot read as parquet ({err})") from err


def transpose_columns(batch: dict[str, Any]) -> list[dict[str, Any]] | None:
    """A collated batch (a dict of equal-length lists or tuples) as rows; None when ``batch`` is not one."""
    columns = list(batch.values())
    if not columns or not all(isinstance(c, list | tuple) for c in columns) or len({len(c) for c in columns}) != 1:
        return None
    return [{k: v[i] for k, v in batch.items()} for i in range(len(columns[0]))]


class RowStream:
    """Rows pulled from an iterator as they are needed (its own order; it may be endless).

    An item is a row (a dict), a prompt (a string or anything else: the row ``{str_key: item}``), a batch of them (a
    list or tuple) or a collated batch (a dict of equal-length lists, as a ``DataLoader`` yields): batches are
    split into rows. An iterator cannot start again: when it ends, drawing raises ``ValueError``.
    """

    def __init__(self, source: Iterator[Any], name: str, str_key: str = "query") -> None:
        self._iterator = source
        self._buffer: list[dict[str, Any]] = []
        self.name = name
        self.str_key = str_key
        self.drawn = 0  # rows handed out since the start (the cursor a resume skips to)

    def _split(self, item: Any) -> list[dict[str, Any]]:
        if isinstance(item, dict):
            rows = transpose_columns(item)
            return rows if rows is not None else [dict(item)]
        if isinstance(item, list | tuple):
            return [row for part in item for row in self._split(part)]
        return [{self.str_key: item}]

    def next_row(self) -> dict[str, Any]:
        """The stream's next row."""
        while not self._buffer:
            try:
                item = next(self._iterator)
            except StopIteration:
                raise ValueError(f"prompt stream {self.name} ended after {self.drawn} rows") from None
            self._buffer = self._split(item)
        self.drawn += 1
        return self._buffer.pop(0)

    def skip(self, count: int) -> None:
        """Draw and drop ``count`` rows (a resume over a source re-created in the same order)."""
        for _ in range(count):
            self.next_row()


def is_stream(source: Any) -> bool:
    """True for an iterator without a length (read as a :class:`RowStream`, never materialised)."""
    return isinstance(source, Iterator) and not hasattr(source, "__len__") and not isinstance(source, str | Path)


def open_source(source: Any) -> RowSource:
    """Wrap ``source`` (Dataset, path to .jsonl/.json/.parquet, or iterable of dicts) as a :class:`RowSource`."""
    if isinstance(source, RowSource):
        return source
    if isinstance(source, str | Path):
        path = Path(source)
        if path.is_dir():
            raise IsADirectoryError(f"prompt source {path} is a folder; give one .jsonl or .parquet file in it")
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
