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
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from llmrl_core.paths import llmrl_home
from storage.trajectories import check_name

TRAJECTORIES_DIR = "trajectories"


def default_runs_root() -> Path:
    """``$LLMRL_RUNS_DIR`` if set, else ``$LLMRL_HOME/runs``."""
    env = os.environ.get("LLMRL_RUNS_DIR")
    return Path(env).expanduser() if env else llmrl_home() / "runs"


@dataclasses.dataclass(frozen=True)
class RunLayout:
    """The default locations of one run under a runs root."""

    run_id: str
    runs_root: Path = dataclasses.field(default_factory=default_runs_root)
    trajectories: str | None = None  # a path or URI; default RUNS_ROOT/trajectories

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

    @property
    def trajectories_uri(self) -> str:
        """Root (path or URI) of the trajectory store."""
        return self.trajectories or str(self.runs_root / TRAJECTORIES_DIR)
