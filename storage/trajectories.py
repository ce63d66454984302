"""The trajectory store: a Parquet dataset partitioned by run and policy version.

Layout (hive style, readable by any Parquet tool with :data:`PARTITIONING` and the schema)::

    ROOT/run_id=<run>/policy_version=<v>/<shard>.parquet

Design choices:

- A shard is keyed by ``(run, policy_version, shard)`` and its file name comes from the shard key
  alone (``shard-00003.parquet`` for shard 3), so a stage re-run after a crash writes the same name and
  replaces the earlier file: idempotent, never a duplicate. The bytes are written under a hidden
  temporary name, then renamed (see :mod:`storage.filesystems`); readers skip hidden names.
- Shard files keep ``run_id`` and ``policy_version`` as real columns (each file stands alone); the
  directory names let readers prune by run and version without opening files.
- Readers list shard files themselves (sorted by run, version, shard), open them as one pyarrow
  dataset with the fixed schema, check each footer's schema version, and push reward / finish-reason
  filters into the scan. Row order is deterministic.
- Any local path or URI works (``file://``, ``s3://``, ``memory://``...): see :func:`resolve_filesystem`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from llmrl_core.paths import SAFE_NAME
from storage.filesystems import (
    TEMP_MARKER,
    is_temp_name,
    join_uri,
    read_bytes,
    resolve_filesystem,
    write_bytes_atomic,
)
from storage.schema import (
    SCHEMA_VERSION,
    TRAJECTORY_SCHEMA,
    TrajectoryRecord,
    TrajectoryValidationError,
    records_to_table,
    schema_version_of,
    sequence_or_single,
    table_to_records,
    to_datasets_table,
    validate_table,
)

if TYPE_CHECKING:
    import datasets

PARTITIONING = ds.partitioning(pa.schema([("run_id", pa.string()), ("policy_version", pa.int64())]), flavor="hive")
_NAME = SAFE_NAME
_RUN_DIR = re.compile(r"^run_id=(.+)$")
_VERSION_DIR = re.compile(r"^policy_version=(\d+)$")
# How shards are encoded (pyarrow's defaults are tuned for low-cardinality columns, trajectories are not): no
# dictionary encoding, whose pages a per-token column (ids, masks, log-probs) and the message texts overflow so
# the writer builds and then drops them; min/max statistics only on the flat columns that row filters compare
# (reward, finish_reason, ...), none for the nested ones. Measured on 2,048 SmolLM2 rows (bench/bench_storage.py):
# write 9.2 -> 5.8 ms, read 5.4 -> 3.2 ms, file 385 -> 294 KB against pyarrow's defaults, zstd on both.
_STATISTICS_COLUMNS = [f.name for f in TRAJECTORY_SCHEMA if not pa.types.is_nested(f.type)]


class TrajectoryStoreError(RuntimeError):
    """A problem with the store itself (unreadable shard, unsupported schema version, bad key)."""


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """One shard file: its key, where it lives, and (after a write) its row count and sha256."""

    run_id: str
    policy_version: int
    name: str
    path: str
    num_rows: int | None = None
    sha256: str | None = None
    size_bytes: int | None = None


class InvalidNameError(TrajectoryStoreError, ValueError):
    """A run id or shard name that cannot be a path segment (a bad input, so also a ValueError)."""


def check_name(value: str, what: str) -> str:
    """Validate a run id or shard name: it becomes a path segment."""
    if not isinstance(value, str) or not _NAME.match(value) or ".tmp-" in value:
        raise InvalidNameError(
            f"invalid {what} {value!r}: use letters, digits, '.', '_' or '-' (not first), at most 200 characters"
        )
    return value


def shard_file_name(shard: int | str) -> str:
    """Deterministic file name of a shard key: ``shard-00003.parquet`` for 3, ``<name>.parquet`` for a name."""
    if isinstance(shard, bool) or not isinstance(shard, int | str):
        raise TrajectoryStoreError(f"shard key must be an int or a name, got {shard!r}")
    if isinstance(shard, int):
        if shard < 0:
            raise TrajectoryStoreError(f"shard index must be >= 0, got {shard}")
        return f"shard-{shard:05d}.parquet"
    return f"{check_name(shard, 'shard name')}.parquet"


class TrajectoryStore:
    """Write and read trajectory shards under a root folder or URI.

    ``TrajectoryStore("runs/trajectories")``, ``TrajectoryStore("s3://bucket/traj")`` or
    ``TrajectoryStore("traj", filesystem=fsspec_or_pyarrow_fs)``.
    """

    def __init__(self, root: str | os.PathLike[str], filesystem: Any = None, compression: str = "zstd") -> None:
        self.uri = os.fspath(root)
        self.fs, self.root = resolve_filesystem(root, filesystem)
        self.compression = compression

    def __repr__(self) -> str:
        return f"TrajectoryStore({self.uri!r})"

    @property
    def write_options(self) -> dict[str, Any]:
        """The ``pyarrow.parquet.write_table`` keywords a shard is written with (codec and encoding)."""
        return {"compression": self.compression, "use_dictionary": False, "write_statistics": _STATISTICS_COLUMNS}

    # ----------------------------------------------------------------- paths
    def partition_path(self, run_id: str, policy_version: int) -> str:
        """Folder of one (run, policy_version) partition."""
        check_name(run_id, "run id")
        if isinstance(policy_version, bool) or not isinstance(policy_version, int) or policy_version < 0:
            raise TrajectoryStoreError(f"policy_version must be an int >= 0, got {policy_version!r}")
        return f"{self.root}/run_id={run_id}/policy_version={policy_version}"

    def shard_path(self, run_id: str, policy_version: int, shard: int | str) -> str:
        """Path of the shard file for a key (whether or not it exists)."""
        return f"{self.partition_path(run_id, policy_version)}/{shard_file_name(shard)}"

    # ----------------------------------------------------------------- write
    def write_shard(
        self,
        run_id: str,
        policy_version: int,
        shard: int | str,
        rows: pa.Table | Iterable[TrajectoryRecord | Mapping[str, Any]],
    ) -> ShardInfo:
        """Validate rows and write them as one shard, atomically; an existing shard with that key is replaced.

        Every row must carry this ``run_id`` and ``policy_version`` (a mismatch names the row).
        """
        path = self.shard_path(run_id, policy_version, shard)
        table = validate_table(rows) if isinstance(rows, pa.Table) else records_to_table(rows)
        if table.num_rows == 0:  # a 0-row shard would make an empty partition look like a stored version
            raise TrajectoryValidationError(f"shard {path}: no rows to write (a shard holds at least one row)")
        for field, expected in (("run_id", run_id), ("policy_version", policy_version)):
            bad = pc.not_equal(table.column(field), pa.scalar(expected, TRAJECTORY_SCHEMA.field(field).type))
            if pc.any(bad).as_py():
                row = pc.index(bad, True).as_py()
                raise TrajectoryValidationError(
                    f"row {row}: field '{field}': {table.column(field)[row].as_py()!r} does not match "
                    f"the shard's {field} {expected!r}"
                )
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, **self.write_options)
        data = sink.getvalue()
        write_bytes_atomic(self.fs, path, data)
        return ShardInfo(
            run_id=run_id,
            policy_version=policy_version,
            name=path.rsplit("/", 1)[-1],
            path=path,
            num_rows=table.num_rows,
            sha256=hashlib.sha256(memoryview(data)).hexdigest(),
            size_bytes=data.size,
        )

    def delete_partition(self, run_id: str, policy_version: int, shard_prefix: str | None = None) -> None:
        """Remove a whole (run, policy_version) partition, or only its shards whose file name starts with
        ``shard_prefix`` (no error when absent)."""
        path = self.partition_path(run_id, policy_version)
        if self.fs.get_file_info(path).type != pafs.FileType.Directory:
            return
        if shard_prefix is None:
            self.fs.delete_dir(path)
            return
        for entry in self.fs.get_file_info(pafs.FileSelector(path)):
            if entry.type == pafs.FileType.File and entry.base_name.startswith(shard_prefix):
                self.fs.delete_file(entry.path)

    def remove_stale_temp_files(self, min_age_s: float = 3600.0) -> list[str]:
        """Delete temporary files left by crashed writers that are older than ``min_age_s``; returns them.

        Readers never see these files; this only reclaims space. Keep ``min_age_s`` above the longest
        shard write so a live writer's temporary file is not removed.
        """
        if self.fs.get_file_info(self.root).type != pafs.FileType.Directory:
            return []
        now = time.time()
        removed = []
        for entry in self.fs.get_file_info(pafs.FileSelector(self.root, recursive=True)):
            if entry.type != pafs.FileType.File or TEMP_MARKER not in entry.base_name:
                continue
            age = now - entry.mtime.timestamp() if entry.mtime is not None else float("inf")
            if age >= min_age_s:
                self.fs.delete_file(entry.path)
                removed.append(entry.path)
        return removed

    # ----------------------------------------------------------------- listing
    def _subdirs(self, path: str, pattern: re.Pattern[str]) -> list[tuple[str, str]]:
        info = self.fs.get_file_info(path)
        if info.type != pafs.FileType.Directory:
            return []
        found = []
        for entry in self.fs.get_file_info(pafs.FileSelector(path)):
            match = pattern.match(entry.base_name)
            if entry.type == pafs.FileType.Directory and match:
                found.append((match.group(1), entry.path))
        return found

    def runs(self) -> list[str]:
        """Run ids present in the store, sorted."""
        return sorted(run for run, _ in self._subdirs(self.root, _RUN_DIR))

    def versions(self, run_id: str) -> list[int]:
        """Policy versions present for a run, ascending."""
        check_name(run_id, "run id")
        return sorted(int(v) for v, _ in self._subdirs(f"{self.root}/run_id={run_id}", _VERSION_DIR))

    def chosen_versions(self, run_id: str, versions: Sequence[int] = ()) -> list[int]:
        """``versions`` (default: every stored one) of ``run_id``, each checked to be stored here; a ``ValueError``
        names the run, the store and what it has otherwise (an SFT or offline run's source, before it starts)."""
        stored = self.versions(run_id)
        if not stored:
            raise ValueError(f"run {run_id!r} has no stored trajectories in {self.root}")
        has = f"{stored[0]}..{stored[-1]}" if stored[-1] - stored[0] + 1 == len(stored) else str(stored)
        missing = sorted(set(versions) - set(stored))
        if missing:
            raise ValueError(
                f"run {run_id!r} has no stored trajectories of version(s) {missing} in {self.root} (it has {has})"
            )
        gaps = sorted(set(range(stored[0], stored[-1] + 1)) - set(stored))
        if not versions and gaps:  # a partition lost (deleted, or a copy that missed it): not trained on in silence
            raise ValueError(
                f"run {run_id!r} has no stored trajectories of version(s) {gaps} in {self.root} (it has {has}): a "
                "version's partition is missing; restore it, or name the versions to use (e.g. versions="
                f"{[v for v in stored][:4]})"
            )
        return list(versions) or stored

    def shards(
        self,
        run_id: str | Sequence[str] | None = None,
        *,
        version: int | None = None,
        min_version: int | None = None,
        max_version: int | None = None,
        shard_prefix: str | None = None,
    ) -> list[ShardInfo]:
        """Visible shard files for a selection, sorted by (run, version, shard name); temp files are skipped.

        ``shard_prefix`` keeps the shards whose file name starts with it (e.g. the shards of one training batch
        of an asynchronous run, several of which may share a policy version)."""
        lo, hi = _version_bounds(version, min_version, max_version)
        runs = self.runs() if run_id is None else [check_name(r, "run id") for r in sequence_or_single(run_id)]
        found = []
        for run in runs:
            for v in self.versions(run):
                if (lo is not None and v < lo) or (hi is not None and v > hi):
                    continue
                folder = self.partition_path(run, v)
                for entry in self.fs.get_file_info(pafs.FileSelector(folder)):
                    if entry.type != pafs.FileType.File or is_temp_name(entry.base_name):
                        continue
                    if shard_prefix is not None and not entry.base_name.startswith(shard_prefix):
                        continue
                    if entry.base_name.endswith(".parquet"):
                        found.append(ShardInfo(run, v, entry.base_name, entry.path, size_bytes=entry.size))
        return sorted(found, key=lambda s: (s.run_id, s.policy_version, s.name))

    # ----------------------------------------------------------------- read
    def _dataset(self, shards: list[ShardInfo]) -> ds.Dataset:
        if not shards:
            return ds.dataset(TRAJECTORY_SCHEMA.empty_table())
        dataset = ds.dataset([s.path for s in shards], schema=TRAJECTORY_SCHEMA, format="parquet", filesystem=self.fs)
        for shard, fragment in zip(shards, dataset.get_fragments(), strict=True):
            try:
                version = schema_version_of(fragment.physical_schema)
            except (OSError, pa.ArrowException) as err:
                raise TrajectoryStoreError(f"cannot read shard {shard.path}: {err}") from err
            if version is None or version > SCHEMA_VERSION:
                raise TrajectoryStoreError(
                    f"shard {shard.path} has schema version {version}; this llmrl reads versions <= {SCHEMA_VERSION}"
                )
        return dataset

    def scanner(
        self,
        run_id: str | Sequence[str] | None = None,
        *,
        version: int | None = None,
        min_version: int | None = None,
        max_version: int | None = None,
        shard_prefix: str | None = None,
        min_reward: float | None = None,
        max_reward: float | None = None,
        finish_reason: str | Sequence[str] | None = None,
        filter: pc.Expression | None = None,
        columns: Sequence[str] | None = None,
        batch_size: int = 1024,
    ) -> ds.Scanner:
        """A pyarrow scanner over the selection: run(s), one version or a version range, and row filters.

        ``filter`` is any pyarrow expression (e.g. ``pc.field("advantage") > 0``); it is combined (AND)
        with ``min_reward`` / ``max_reward`` / ``finish_reason``.
        """
        shards = self.shards(
            run_id, version=version, min_version=min_version, max_version=max_version, shard_prefix=shard_prefix
        )
        dataset = self._dataset(shards)
        expression = _row_filter(min_reward, max_reward, finish_reason, filter)
        if columns is not None:
            unknown = sorted(set(columns) - set(TRAJECTORY_SCHEMA.names))
            if unknown:
                raise TrajectoryStoreError(f"unknown column(s) {unknown}")
        return dataset.scanner(
            columns=list(columns) if columns is not None else None, filter=expression, batch_size=batch_size
        )

    def read_table(self, run_id: str | Sequence[str] | None = None, **selection: Any) -> pa.Table:
        """The selected rows as one pyarrow Table (same selection arguments as :meth:`scanner`)."""
        try:
            return self.scanner(run_id, **selection).to_table()
        except (OSError, pa.ArrowException) as err:
            raise self._corruption_error(run_id, selection, err) from err

    def iter_batches(self, run_id: str | Sequence[str] | None = None, **selection: Any) -> Iterator[pa.RecordBatch]:
        """The selected rows as record batches of at most ``batch_size`` rows (streaming, low memory)."""
        try:
            yield from self.scanner(run_id, **selection).to_batches()
        except (OSError, pa.ArrowException) as err:
            raise self._corruption_error(run_id, selection, err) from err

    def _corruption_error(self, run_id: Any, selection: Mapping[str, Any], err: Exception) -> TrajectoryStoreError:
        """Name the shard that cannot be read (each shard of the selection is read alone to find it)."""
        keys = ("version", "min_version", "max_version", "shard_prefix")
        for shard in self.shards(run_id, **{k: v for k, v in selection.items() if k in keys}):
            try:
                pq.read_table(shard.path, filesystem=self.fs)
            except (OSError, pa.ArrowException) as shard_err:
                return TrajectoryStoreError(
                    f"shard {shard.path} is corrupt ({shard_err}); the run's other shards and versions stay readable: "
                    "move the file away (select other versions to read around it) or re-collect that version"
                )
        return TrajectoryStoreError(f"cannot read the selected trajectories under {self.uri}: {err}")

    def read_records(self, run_id: str | Sequence[str] | None = None, **selection: Any) -> list[TrajectoryRecord]:
        """The selected rows as :class:`TrajectoryRecord` objects."""
        return table_to_records(self.read_table(run_id, **selection))

    def read_dataset(self, run_id: str | Sequence[str] | None = None, **selection: Any) -> datasets.Dataset:
        """The selected rows as a Hugging Face ``datasets.Dataset`` (in memory).

        ``reward_components`` becomes a list of ``{key, value}`` (``datasets`` has no map type).
        """
        import datasets

        return datasets.Dataset(to_datasets_table(self.read_table(run_id, **selection)))

    # ----------------------------------------------------------------- lineage helpers
    def partition_digest(
        self, run_id: str, policy_version: int, shard_prefix: str | None = None
    ) -> tuple[str, int, list[ShardInfo]]:
        """(sha256 over the partition's shard names and contents, row count, shards) for lineage records
        (only the shards whose name starts with ``shard_prefix`` when given)."""
        shards = self.shards(run_id, version=policy_version, shard_prefix=shard_prefix)
        digest = hashlib.sha256()
        rows = 0
        for shard in shards:
            digest.update(shard.name.encode() + b"\0")
            data = read_bytes(self.fs, shard.path)
            digest.update(hashlib.sha256(data).digest())
            try:
                rows += pq.read_metadata(pa.BufferReader(data)).num_rows
            except (OSError, pa.ArrowException) as err:
                raise TrajectoryStoreError(
                    f"shard {shard.path} is not a readable parquet file ({err}); move it away or re-collect "
                    f"version {policy_version} of run {run_id!r}"
                ) from err
        return digest.hexdigest(), rows, shards

    def partition_uri(self, run_id: str, policy_version: int) -> str:
        """A human-readable location of a partition: the root URI plus the partition folder."""
        self.partition_path(run_id, policy_version)
        return join_uri(self.uri, f"run_id={run_id}", f"policy_version={policy_version}")


def _version_bounds(version: int | None, lo: int | None, hi: int | None) -> tuple[int | None, int | None]:
    if version is not None:
        if lo is not None or hi is not None:
            raise TrajectoryStoreError("give either version or min_version/max_version, not both")
        return version, version
    if lo is not None and hi is not None and lo > hi:
        raise TrajectoryStoreError(f"empty version range: min_version {lo} > max_version {hi}")
    return lo, hi


def _row_filter(
    min_reward: float | None,
    max_reward: float | None,
    finish_reason: str | Sequence[str] | None,
    extra: pc.Expression | None,
) -> pc.Expression | None:
    terms = []
    if min_reward is not None:
        terms.append(pc.field("reward") >= min_reward)
    if max_reward is not None:
        terms.append(pc.field("reward") <= max_reward)
    if finish_reason is not None:
        terms.append(pc.field("finish_reason").isin(sequence_or_single(finish_reason)))
    if extra is not None:
        terms.append(extra)
    expression = None
    for term in terms:
        expression = term if expression is None else expression & term
    return expression
