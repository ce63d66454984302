"""Where a training run keeps its things by default (every location can be overridden).

::

    RUNS_ROOT/                      # $LLMRL_RUNS_DIR, default $LLMRL_HOME/runs
      mlflow.db                     # default MLflow tracking store (sqlite), shared by the runs here
      mlartifacts/                  # default MLflow artifact location
      trajectories/                 # one trajectory store shared by all runs, partitioned by run_id
        run_id=<RUN>/policy_version=<v>/shard-00000.parquet
      <RUN>/                        # the run directory
        checkpoints/                # policy_v000003.safetensors + .manifest.json

A shared trajectory store lets offline training read many runs with one reader; the trajectory root
may also be any URI (e.g. ``s3://bucket/trajectories``).

A runs root given as a URI of another filesystem (``runs_dir: s3://bucket/runs?endpoint_override=...``, see
:meth:`RunLayout.for_runs_dir`) splits the run in two. What the Dask workers read and write lives under the
URI, so no worker needs the flow host's disk::

    URI/trajectories/run_id=<RUN>/...   # the trajectory store
    URI/<RUN>/checkpoints/              # weights + manifests (engines load them through the store)
    URI/<RUN>/staging/                  # rollout shards in progress
    URI/<RUN>/state/trainer-v<v>.pt     # the trainer's optimizer + RNG state
    URI/<RUN>/state/published-v<v>.json # copies of the commit markers (for another flow host)
    URI/<RUN>/sft-data/, offline-data/  # the sft / offline training set the trainer reads
    URI/<RUN>/selected/, rescored/      # the trajectories sft selected / offline re-scored

and what only the flow host touches stays on its disk, under its own runs root (``$LLMRL_RUNS_DIR`` /
``$LLMRL_HOME/runs``): the run's ``config.json``, commit markers (``state/published-v<v>.json``),
reports, lineage and the MLflow store. The training flows (grpo, sft, offline) also write each commit marker to
``URI/<RUN>/state/`` (:attr:`RunLayout.markers_uri`) and fetch the ones their host lacks before they resume, so
a resume may start from another flow host; that host's MLflow store then holds a new MLflow run for the versions it
trains, unless ``tracking_uri`` names a server both hosts use.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from llmrl_core.paths import llmrl_home
from storage.filesystems import is_remote_uri, join_uri, resolve_filesystem
from storage.trajectories import check_name

TRAJECTORIES_DIR = "trajectories"


def default_runs_root() -> Path:
    """``$LLMRL_RUNS_DIR`` if set, else ``$LLMRL_HOME/runs``."""
    env = os.environ.get("LLMRL_RUNS_DIR")
    return Path(env).expanduser() if env else llmrl_home() / "runs"


@dataclasses.dataclass(frozen=True)
class RunLayout:
    """The default locations of one run under a runs root (and, for a remote runs root, a data URI: see the
    module docstring)."""

    run_id: str
    runs_root: Path = dataclasses.field(default_factory=default_runs_root)
    trajectories: str | None = None  # a path or URI; default RUNS_ROOT/trajectories (DATA_URI/trajectories)
    data_uri: str | None = None  # where the workers' data lives when it is not under runs_root (a remote URI)

    @classmethod
    def for_runs_dir(cls, run_id: str, runs_dir: str | os.PathLike[str] | None) -> RunLayout:
        """The layout a flow uses for a ``runs_dir`` setting: a local folder (None: the default runs root), or a
        remote URI for the workers' data with the flow host's own records under its default runs root."""
        if runs_dir is not None and is_remote_uri(runs_dir):
            return cls(run_id, default_runs_root(), data_uri=os.fspath(runs_dir))
        text = os.fspath(runs_dir).removeprefix("file://") if runs_dir is not None else ""
        return cls(run_id, Path(text) if text else default_runs_root())

    def __post_init__(self) -> None:
        check_name(self.run_id, "run id")
        if self.run_id == TRAJECTORIES_DIR:
            raise ValueError(f"run id {self.run_id!r} is reserved (it is the trajectory store's folder)")
        object.__setattr__(self, "runs_root", Path(self.runs_root).expanduser().absolute())

    @property
    def run_dir(self) -> Path:
        """The run directory."""
        return self.runs_root / self.run_id

    @property
    def checkpoints_dir(self) -> Path:
        """Folder of the run's checkpoint store."""
        return self.run_dir / "checkpoints"

    def data_location(self, *parts: str) -> str:
        """A location of the workers' data: under the data URI when there is one, else under the run folder."""
        if self.data_uri:
            return join_uri(self.data_uri, self.run_id, *parts)
        return str(self.run_dir.joinpath(*parts))

    @property
    def checkpoints_uri(self) -> str:
        """Root (path or URI) of the run's checkpoint store."""
        return self.data_location("checkpoints") if self.data_uri else str(self.checkpoints_dir)

    @property
    def staging_uri(self) -> str:
        """Root (path or URI) of the run's staging store (rollout shards in progress)."""
        return self.data_location("staging")

    @property
    def trainer_state_uri(self) -> str:
        """Folder (path or URI) of the trainer's optimizer and RNG states."""
        return self.data_location("state")

    def trainer_state_file(self, version: int) -> tuple[Any, str]:
        """``(filesystem, path)`` of the optimizer/RNG state the trainer saved at ``version`` (a local folder or a
        remote store)."""
        fs, folder = resolve_filesystem(self.trainer_state_uri)
        return fs, f"{folder}/trainer-v{version}.pt"

    @property
    def markers_uri(self) -> str | None:
        """Where the flow copies its commit markers when the workers' data is remote (``DATA_URI/<RUN>/state``,
        beside the trainer states), so that a resume from another flow host finds them; None for a local run."""
        return self.data_location("state") if self.data_uri else None

    @property
    def trajectories_uri(self) -> str:
        """Root (path or URI) of the trajectory store."""
        if self.trajectories:
            return self.trajectories
        if self.data_uri:
            return join_uri(self.data_uri, TRAJECTORIES_DIR)
        return str(self.runs_root / TRAJECTORIES_DIR)
