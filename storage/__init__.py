"""storage: where llmrl keeps what it produces, and how it remembers where it came from.

- :mod:`storage.schema` - the versioned Arrow schema of one trajectory row, ``TrajectoryRecord``,
  ``records_to_table`` and row validation;
- :mod:`storage.trajectories` - ``TrajectoryStore``: Parquet shards partitioned by run and policy
  version, atomic and idempotent, readable as pyarrow tables, batches or ``datasets.Dataset``;
- :mod:`storage.checkpoints` - ``CheckpointStore``: safetensors per policy version plus a manifest;
- :mod:`storage.lineage` / :mod:`storage.lineage_query` - MLflow records of which data, config, code
  and parent weights produced each version;
- :mod:`storage.layout` - the default places of a run's files; :mod:`storage.filesystems` - paths and
  URIs (local, ``file://``, ``s3://``, any fsspec filesystem) and atomic publication.

Nothing is imported here, so ``import storage.trajectories`` does not pull in MLflow.
"""
