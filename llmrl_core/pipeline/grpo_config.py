"""``GRPOConfig``: every setting of a GRPO run, grouped by stage (YAML sections of the same names)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from llmrl_core.pipeline.task_config import TaskConfig


@dataclass
class DataConfig:
    """Prompt source and batch shape: ``prompts_per_iteration`` prompts, each sampled ``group_size`` times."""

    source: str = "gsm8k:train"  # gsm8k:train | arithmetic:train[?ops=+&low=10&high=99] | a .jsonl/.parquet path
    prompts_per_iteration: int = 8
    group_size: int = 4
    shuffle: bool = True

    def __post_init__(self) -> None:
        if self.prompts_per_iteration < 1 or self.group_size < 1:
            raise ValueError("prompts_per_iteration and group_size must be >= 1")


@dataclass
class RolloutConfig:
    """Rollout workers and sampling: one resident vLLM engine per worker."""

    workers: int = 1
    dtype: str = "bfloat16"
    kv_cache_gb: float = 1.0
    max_new_tokens: int = 128
    temperature: float = 0.7
    top_p: float = 1.0
    max_model_len: int = 2048


@dataclass
class TrainConfig:
    """The trainer: GRPO loss options, optimizer, steps per iteration and placement."""

    lr: float = 5e-6
    steps_per_iteration: int = 1
    clip_epsilon: float = 0.2
    kl_coef: float = 0.0
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    aggregation: Literal["token_mean", "prompt_mean"] = "token_mean"
    entropy_coeff: float = 0.0
    max_grad_norm: float = 1.0
    # Train only on groups whose rewards differ: an all-equal group has zero advantage, so it adds no policy
    # gradient, only tokens to the token-mean (diluting the rest) and compute. With kl_coef > 0 those groups
    # would still pull towards the reference; they are dropped all the same. Rows stay in the store.
    skip_zero_signal_groups: bool = False
    token_budget: int = 2048  # tokens per packed micro-batch: bounds the (tokens x vocab) logits memory
    mixed_precision: Literal["auto", "bf16", "no"] = "auto"
    threads: int = 0  # torch threads on the trainer worker (0: all cores)
    device: str = "auto"  # "auto" | "cpu" | "cuda"; a GPU trainer is placed on a worker with resource GPU=1


@dataclass
class DaskConfig:
    """Where the stages run: a LocalCluster (rollout workers + 1 trainer) or an existing scheduler."""

    address: str | None = None  # e.g. tcp://127.0.0.1:8786; workers declare resources ROLLOUT / TRAINER or GPU
    local_directory: str | None = None


@dataclass
class GRPOConfig:
    """A GRPO run: model, data, rollouts, training, iterations, storage and tracking."""

    run_id: str = "grpo-demo"
    model: str = "default"
    iterations: int = 3
    seed: int = 0
    runs_dir: str | None = None  # default $LLMRL_HOME/runs
    tracking_uri: str | None = None  # default sqlite under the run dir
    keep_checkpoints: int = 3  # the newest N checkpoints are kept...
    keep_every: int | None = None  # ...plus every version divisible by this (e.g. 10, for evaluation curves)
    data: DataConfig = field(default_factory=DataConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    dask: DaskConfig = field(default_factory=DaskConfig)
    progress: bool = True  # progress bars: iterations (flow), rollout prompts (vLLM), train micro-batches
    fail_after_stage: str | None = None  # fault injection for tests: "<stage>@<version>" raises after that stage

    def __post_init__(self) -> None:
        if self.iterations < 0:
            raise ValueError("iterations must be >= 0")
