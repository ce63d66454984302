"""``SFTConfig``: every setting of a supervised fine-tuning run (YAML sections of the same names).

Two data sources, picked by ``source``:

- ``dataset``: chats from ``data.source`` -- ``gsm8k:train`` / ``gsm8k:test`` (question/answer rows rendered as a
  user/assistant chat) or a ``.jsonl`` / ``.parquet`` file whose rows hold a ``messages`` list (or
  question/answer fields);
- ``trajectories``: stored rollouts of ``trajectories.run_id`` (chosen ``versions``), kept by
  ``TopKRewardSelector`` (rejection sampling: the best ``topk`` responses above each group's median).

One policy version is published per epoch (version 0 is the starting model).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import Field

from llmrl_core.pipeline.config_io import strict_config
from llmrl_core.pipeline.config_types import AtLeast1, NonNegative, NonNegativeInt, Positive
from llmrl_core.pipeline.env_config import EnvConfig, validate_env_config
from llmrl_core.pipeline.grpo_config import DaskConfig, LoraConfig
from llmrl_core.pipeline.init_config import InitConfig
from llmrl_core.pipeline.task_config import TaskConfig


@dataclass
class SFTDataConfig:
    """A chat dataset: where it is, which field holds the chats, how GSM8K rows are rendered, how many rows."""

    source: str = "gsm8k:train"  # "gsm8k:train" | "gsm8k:test" | a .jsonl/.parquet path
    messages_key: str = "messages"  # rows with this field are chats; otherwise question/answer rows
    gsm8k_format: Literal["tags", "plain"] = "tags"  # tags: the env's prompt + <think>..</think><answer>..</answer>
    limit: AtLeast1 | None = 64  # first N rows (None: all)
    # tokens per sample (prompt + response); longer samples are truncated
    max_length: Annotated[int, Field(ge=2)] = 1024


@dataclass
class SFTTrajectoriesConfig:
    """Stored rollouts as SFT data: which run and versions, and the top-k rejection-sampling rule."""

    run_id: str | None = None  # the run whose trajectories are read
    versions: list[int] = field(default_factory=list)  # empty: every stored version
    store: str | None = None  # trajectory store root; default RUNS_DIR/trajectories
    topk: AtLeast1 = 1  # responses kept per prompt group
    above_median: bool = True  # only responses strictly above their group's median reward


@dataclass
class SFTTrainConfig:
    """The trainer: SFT loss options (TorchRL's SFTLoss names), optimizer, batch size and placement."""

    lr: Positive = 1e-5  # AdamW learning rate
    # a resume whose optimizer/RNG state is missing is an error; true: resume from the weights with a fresh optimizer
    resume_without_state: bool = False
    batch_size: AtLeast1 = 8  # samples per optimizer step
    loss_function: Literal["sft", "minor_sft"] = "sft"  # minor_sft: weighted by the reference (uses beta)
    normalize_by_seq_length: bool = True  # average each sample's loss over its tokens (false: sum)
    beta: NonNegative = 0.1  # minor_sft temperature
    kl_to_ref_coeff: NonNegative = 0.0  # > 0 adds the KL to the frozen starting model (sft only)
    max_grad_norm: Positive = 1.0  # gradient clipping norm
    token_budget: Annotated[int, Field(ge=16)] = 2048  # tokens per packed micro-batch
    mixed_precision: Literal["auto", "bf16", "no"] = "auto"  # auto: bf16 autocast where bf16 is native
    gradient_checkpointing: bool = False  # recompute activations in the backward pass (less memory, slower)
    lora: LoraConfig = field(default_factory=LoraConfig)  # train low-rank adapters instead of every weight
    threads: NonNegativeInt = 0  # torch threads on the trainer worker (0: all cores)
    device: Literal["auto", "cpu", "cuda"] = "auto"  # a GPU trainer is placed on a worker with resource GPU=1


@strict_config  # the run form's schema describes every setting; unknown keys are refused
@dataclass
class SFTConfig:
    """An SFT run: model, data (a dataset or selected trajectories), epochs, storage and tracking."""

    run_id: str = "sft-demo"  # the run: its folder, its MLflow run; the same run_id again resumes it
    model: str = "default"  # "default" (packaged SmolLM2-135M-Instruct), a folder or an `llmrl models` name
    source: Literal["dataset", "trajectories"] = "dataset"  # train on data (a chat set) or on trajectories
    epochs: NonNegativeInt = 1  # passes over the training set (the run's last version number)
    seed: int = 0  # seeds the batch order and the trainer's RNG
    runs_dir: str | None = None  # default $LLMRL_HOME/runs
    tracking_uri: str | None = None  # default: one sqlite store per runs root (<runs_dir>/mlflow.db)
    keep_checkpoints: int = 3  # the newest N checkpoints are kept
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    trajectories: SFTTrajectoriesConfig = field(default_factory=SFTTrajectoriesConfig)
    train: SFTTrainConfig = field(default_factory=SFTTrainConfig)
    init: InitConfig = field(default_factory=InitConfig)  # a new run's start: the model, or RUN@V (a fork)
    dask: DaskConfig = field(default_factory=DaskConfig)
    # The env the run's versions are used in: question/answer rows (gsm8k_format "tags") get the prompt this env
    # gives them (system prompt, few-shot turns, tool instructions), and `llmrl run evaluate` plays it.
    task: TaskConfig = field(default_factory=TaskConfig)
    env: EnvConfig = field(default_factory=EnvConfig)

    def __post_init__(self) -> None:
        validate_env_config(self.env)
        if self.source == "trajectories" and not self.trajectories.run_id:
            raise ValueError("source 'trajectories' needs trajectories.run_id")
