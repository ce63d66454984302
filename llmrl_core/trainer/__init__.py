"""The train step: packed micro-batches, gradient accumulation, AdamW, clipping, LoRA, metrics, data parallel."""

from llmrl_core.trainer.batch import PackedBatch, TrainSample, pack_samples, plan_micro_batches
from llmrl_core.trainer.data_parallel import DataParallelTrainer, run_data_parallel, shard_samples
from llmrl_core.trainer.lora import LoraOptions, apply_lora, export_adapter, merged_state_dict
from llmrl_core.trainer.scoring import TokenScores, score_packed
from llmrl_core.trainer.train_step import StepTotals, Trainer, TrainerConfig

__all__ = [
    "DataParallelTrainer",
    "LoraOptions",
    "PackedBatch",
    "StepTotals",
    "TokenScores",
    "TrainSample",
    "Trainer",
    "TrainerConfig",
    "apply_lora",
    "export_adapter",
    "merged_state_dict",
    "pack_samples",
    "plan_micro_batches",
    "run_data_parallel",
    "score_packed",
    "shard_samples",
]
