"""``OfflineConfig``: GRPO from stored trajectories of another run, optionally re-scored, with no new rollouts.

The rows of ``source.run_id`` at ``source.versions`` are (optionally) re-scored with a reward from
:mod:`llmrl_core.pipeline.rescoring` (``rescore.reward``), their advantages recomputed per prompt group
(``mc_advantage``), and the policy trained for ``epochs`` passes (one published version per epoch) into the
new run ``run_id``. ``train`` is the GRPO trainer section of :class:`~llmrl_core.pipeline.grpo_config.GRPOConfig`;
its ``steps_per_iteration`` is the number of optimizer steps per mini-batch here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llmrl_core.pipeline.config_io import strict_config
from llmrl_core.pipeline.config_types import AtLeast1, NonNegativeInt
from llmrl_core.pipeline.env_config import EnvConfig, validate_env_config
from llmrl_core.pipeline.grpo_config import DaskConfig, TrainConfig
from llmrl_core.pipeline.init_config import InitConfig
from llmrl_core.pipeline.task_config import TaskConfig


@dataclass
class OfflineSourceConfig:
    """Which stored trajectories to train on."""

    run_id: str = "grpo-demo"  # the run whose trajectories are trained on
    versions: list[int] = field(default_factory=list)  # empty: every stored version
    store: str | None = None  # trajectory store root; default RUNS_DIR/trajectories


@dataclass
class RescoreConfig:
    """The reward to re-score stored responses with (``stored`` keeps their rewards)."""

    reward: str = "stored"  # in rescoring.REWARDS: stored | gsm8k | gsm8k_strict | brevity | env (env.rewards)
    answers: str = "gsm8k:train"  # gsm8k rewards: the dataset the stored prompt ids index (gsm8k:SPLIT or a path)
    options: dict[str, Any] = field(default_factory=dict)  # reward options, e.g. {format_reward: 0.0}


@strict_config  # the run form's schema describes every setting; unknown keys are refused
@dataclass
class OfflineConfig:
    """An offline GRPO run: source trajectories, re-scoring, epochs, trainer, storage and tracking."""

    run_id: str = "offline-demo"  # this run: its folder, its MLflow run; the same run_id again resumes it
    model: str = "default"  # starting weights
    epochs: NonNegativeInt = 1  # passes over the stored trajectories (the run's last version number)
    groups_per_step: AtLeast1 = 8  # prompt groups per mini-batch
    skip_zero_signal: bool = True  # leave out groups whose (re-scored) rewards are all equal: no gradient
    seed: int = 0  # seeds the batch order and the trainer's RNG
    runs_dir: str | None = None  # default $LLMRL_HOME/runs
    tracking_uri: str | None = None  # default: one sqlite store per runs root (<runs_dir>/mlflow.db)
    keep_checkpoints: int = 3  # the newest N checkpoints are kept
    source: OfflineSourceConfig = field(default_factory=OfflineSourceConfig)
    rescore: RescoreConfig = field(default_factory=RescoreConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    init: InitConfig = field(default_factory=InitConfig)  # a new run's start: the model, or RUN@V (a fork)
    dask: DaskConfig = field(default_factory=DaskConfig)
    # The env the trained versions are used in (`llmrl run evaluate` plays it); with rescore.reward "env" its
    # reward functions re-score the stored responses.
    task: TaskConfig = field(default_factory=TaskConfig)
    env: EnvConfig = field(default_factory=EnvConfig)

    def __post_init__(self) -> None:
        validate_env_config(self.env)
        if self.rescore.reward == "env" and not self.env.rewards:
            raise ValueError("rescore.reward 'env' re-scores with env.rewards, which is empty")
        if self.train.data_parallel != 1:
            raise ValueError(
                f"train.data_parallel={self.train.data_parallel}: offline GRPO trains on one trainer (the GRPO flow "
                "runs data-parallel ranks); set train.data_parallel=1"
            )
        if self.run_id == self.source.run_id:
            raise ValueError(
                f"run_id {self.run_id!r} must differ from source.run_id (offline training writes a new run)"
            )
