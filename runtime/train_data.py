"""Prepared training data: one Parquet file of train samples that the resident trainer reads by path or URI.

Both the SFT flow (tokenized chats or selected trajectories) and the offline flow (re-scored trajectories with
recomputed advantages) write their training set here once; the trainer actor then runs epochs over it.
Columns: ``sample_id``, ``group`` (rows of one prompt group stay in one mini-batch), ``prompt_ids``,
``response_ids``, ``response_mask``, ``advantage`` and the optional per-token ``sampler_logprobs`` /
``ref_logprobs``. The file is written atomically (temporary file + rename), on the local disk or in the run's
data store (a remote ``runs_dir``), where a trainer on another node reads it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from llmrl_core.trainer.batch import TrainSample
from storage.filesystems import is_local, resolve_filesystem, write_bytes_atomic

SAMPLES_SCHEMA = pa.schema(
    [
        pa.field("sample_id", pa.string(), nullable=False),
        pa.field("group", pa.string(), nullable=False),
        pa.field("prompt_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("response_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("response_mask", pa.list_(pa.bool_()), nullable=False),
        pa.field("advantage", pa.float64(), nullable=False),
        pa.field("sampler_logprobs", pa.list_(pa.float32())),
        pa.field("ref_logprobs", pa.list_(pa.float32())),
    ]
)


@dataclass(frozen=True)
class PreparedSamples:
    """A training-set file as written: where it is (a local path or a URI) and the sha256 of its bytes."""

    location: str
    sha256: str


def write_samples(
    path: str | os.PathLike[str], samples: Sequence[TrainSample], groups: Sequence[str]
) -> PreparedSamples:
    """Write ``samples`` (with their group keys) to ``path`` (a local path or any filesystem URI) atomically."""
    if len(samples) != len(groups):
        raise ValueError(f"{len(samples)} samples but {len(groups)} group keys")
    if not samples:
        raise ValueError(f"{path}: refusing to write an empty training set")
    columns = {
        "sample_id": [s.sample_id for s in samples],
        "group": [str(g) for g in groups],
        "prompt_ids": [list(s.prompt_ids) for s in samples],
        "response_ids": [list(s.response_ids) for s in samples],
        "response_mask": [list(s.response_mask or []) for s in samples],
        "advantage": [float(s.advantage) if isinstance(s.advantage, float) else 0.0 for s in samples],
        "sampler_logprobs": [list(s.sampler_logprobs) if s.sampler_logprobs is not None else None for s in samples],
        "ref_logprobs": [list(s.ref_logprobs) if s.ref_logprobs is not None else None for s in samples],
    }
    table = pa.Table.from_pydict(columns, schema=SAMPLES_SCHEMA)
    buffer = pa.BufferOutputStream()
    pq.write_table(table, buffer, compression="zstd")
    data = buffer.getvalue()
    fs, where = resolve_filesystem(path)
    write_bytes_atomic(fs, where, data)
    return PreparedSamples(
        str(Path(path).absolute()) if is_local(fs) else os.fspath(path), hashlib.sha256(data).hexdigest()
    )


def read_samples(path: str | os.PathLike[str]) -> tuple[list[TrainSample], list[str]]:
    """The samples and group keys of a file written by :func:`write_samples` (a path or URI)."""
    try:
        fs, where = resolve_filesystem(path)
        table = pq.read_table(where, filesystem=fs)
    except (OSError, ValueError, pa.ArrowException) as err:
        raise ValueError(f"{path}: cannot read the training set ({err})") from err
    missing = sorted(set(SAMPLES_SCHEMA.names) - set(table.column_names))
    if missing:
        raise ValueError(f"{path}: training set lacks column(s) {missing}")
    samples = [
        TrainSample(
            prompt_ids=row["prompt_ids"],
            response_ids=row["response_ids"],
            response_mask=row["response_mask"],
            advantage=row["advantage"],
            sampler_logprobs=row["sampler_logprobs"],
            ref_logprobs=row["ref_logprobs"],
            sample_id=f"{path}#{i} ({row['sample_id']})",
        )
        for i, row in enumerate(table.to_pylist())
    ]
    return samples, [str(g) for g in table.column("group").to_pylist()]


def samples_fingerprint(path: str | os.PathLike[str]) -> tuple[str, int | None, int | None]:
    """``(location, mtime in ns, size)`` of a training-set file: what a reader caches it by."""
    fs, where = resolve_filesystem(path)
    info = fs.get_file_info(where)
    if info.type != pafs.FileType.File:
        raise ValueError(f"{path}: no training set there")
    return os.fspath(path), info.mtime_ns, info.size


def epoch_batches(groups: Sequence[str], groups_per_batch: int, seed: int, epoch: int) -> list[list[int]]:
    """Row indices per mini-batch for one epoch: whole groups in a seeded order, ``groups_per_batch`` at a time."""
    if groups_per_batch < 1:
        raise ValueError(f"groups_per_batch must be >= 1, got {groups_per_batch}")
    members: dict[str, list[int]] = {}
    for row, group in enumerate(groups):
        members.setdefault(group, []).append(row)
    keys = list(members)
    order = np.random.default_rng([seed, epoch]).permutation(len(keys))
    batches = []
    for start in range(0, len(keys), groups_per_batch):
        batches.append([row for k in order[start : start + groups_per_batch] for row in members[keys[int(k)]]])
    return batches
