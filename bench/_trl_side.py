"""TRL's side of ``bench_train_vs_trl.py``: GRPOTrainer train steps on a fixed, pre-generated batch.

Runs in the TRL venv (``bench/.venv-trl``, made by ``bench_train_vs_trl.py``), never in the project's venv.

    bench/.venv-trl/bin/python bench/_trl_side.py --data batch.json --model MODEL_DIR --steps N [--dtype bf16]

``batch.json`` holds the prompt and completion token ids, one advantage per row, the sampling temperature and
the loss settings. ``GRPOTrainer._generate_and_score_completions`` is replaced by a method returning that batch
in the layout TRL's own method returns (prompts left-padded, completions right-padded, masks, advantages,
``num_items_in_batch``), so ``trainer.train()`` runs TRL's real loop (dataloader, ``_prepare_inputs``,
``compute_loss``, backward, clipping, AdamW, scheduler) without generating. The loop is paced by the parent over
stdin/stdout, one JSON object per line on stdout, prefixed with ``@@``:

- ``{"event": "ready", ...}`` at ``on_step_begin``, then the side blocks until the parent writes ``go`` (or
  ``quit``); the step's clock starts when ``go`` is read,
- ``{"event": "step", "seconds": s}`` at ``on_step_end`` (clock stopped: forward, backward, clip, optimizer step),
- ``{"event": "log", ...}`` for TRL's logged metrics (loss, grad_norm, ...) and ``{"event": "done"}`` at the end.

While it waits for ``go`` the process is idle, so the parent's own measurements run alone on the CPU.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time

import torch
import trl
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import pad


def emit(**message) -> None:
    print("@@" + json.dumps(message), flush=True)


def fixed_batch(data: dict, pad_id: int) -> dict[str, torch.Tensor]:
    """The dict ``_generate_and_score_completions`` returns, built from stored token ids (no generation)."""
    prompts = [torch.tensor(p, dtype=torch.long) for p in data["prompts"]]
    completions = [torch.tensor(c, dtype=torch.long) for c in data["completions"]]
    ones = [torch.ones_like(t) for t in prompts]
    completion_ones = [torch.ones_like(t) for t in completions]
    completion_mask = pad(completion_ones, padding_value=0, padding_side="right")
    return {
        "prompt_ids": pad(prompts, padding_value=pad_id, padding_side="left"),
        "prompt_mask": pad(ones, padding_value=0, padding_side="left"),
        "completion_ids": pad(completions, padding_value=pad_id, padding_side="right"),
        "completion_mask": completion_mask,
        "advantages": torch.tensor(data["advantages"], dtype=torch.float32),
        "num_items_in_batch": completion_mask.sum(),
    }


class FixedBatchGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose generation + scoring stage returns the stored batch."""

    fixed: dict[str, torch.Tensor] = {}

    def _generate_and_score_completions(self, inputs):  # noqa: ARG002 (the dataset rows are placeholders)
        return {k: v.to(self.accelerator.device) for k, v in self.fixed.items()}


class Pacer(TrainerCallback):
    """Blocks before each optimizer step until the parent says ``go``; reports each step's wall time."""

    def __init__(self) -> None:
        self.start = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        emit(event="ready", step=state.global_step)
        command = sys.stdin.readline().strip()
        if command != "go":
            control.should_training_stop = True
            sys.exit(0)
        self.start = time.perf_counter()
        return control

    def on_step_end(self, args, state, control, **kwargs):
        emit(event="step", step=state.global_step, seconds=time.perf_counter() - self.start)
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        emit(
            event="log", step=state.global_step, **{k: v for k, v in (logs or {}).items() if isinstance(v, float | int)}
        )
        return control


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    args = parser.parse_args()
    with open(args.data, encoding="utf-8") as f:
        data = json.load(f)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    rows = len(data["prompts"])
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"),
        use_cpu=True,
        bf16=args.dtype == "bf16",
        per_device_train_batch_size=rows,  # the whole batch in one micro-batch, one optimizer step
        gradient_accumulation_steps=1,
        num_generations=data["group_size"],
        max_completion_length=data["max_completion_length"],
        temperature=data["temperature"],
        learning_rate=data["lr"],
        lr_scheduler_type="constant",
        max_grad_norm=data["max_grad_norm"],
        weight_decay=0.0,
        beta=0.0,
        epsilon=data["clip_epsilon"],
        loss_type="dapo",  # token mean over the batch's completion tokens (= ours token_mean, one micro-batch)
        num_iterations=1,
        gradient_checkpointing=False,
        disable_dropout=True,
        max_steps=args.steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )
    FixedBatchGRPOTrainer.fixed = fixed_batch(data, pad_id)
    dataset = Dataset.from_list([{"prompt": f"placeholder {i}"} for i in range(rows)])
    trainer = FixedBatchGRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[Pacer()],
    )
    batch = FixedBatchGRPOTrainer.fixed
    emit(
        event="setup",
        trl=trl.__version__,
        torch=torch.__version__,
        transformers=__import__("transformers").__version__,
        threads=torch.get_num_threads(),
        padded_shape=[rows, batch["prompt_ids"].shape[1] + batch["completion_ids"].shape[1]],
        optim=str(config.optim),
    )
    trainer.train()
    shutil.rmtree(config.output_dir, ignore_errors=True)  # save_strategy "no": only empty folders in it
    emit(event="done")


if __name__ == "__main__":
    main()
