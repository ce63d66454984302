"""TRL's side of ``bench_time_to_accuracy.py``: ``trl.GRPOTrainer`` trains the main job's task, generating itself.

Runs in the TRL venv (``bench/.venv-trl``), never in the project's venv.

    bench/.venv-trl/bin/python bench/_trl_tta_side.py --data task.json --model MODEL_DIR --out DIR --steps N

``task.json`` holds the training prompts in the order llmrl served them (chat-templated text, one per group),
their answer fields and the shared settings (group size, completion length, temperature, lr, clipping). The
trainer is TRL's own, unchanged: it generates (transformers ``generate``), scores, computes advantages and
steps. Two things cross to the parent, one JSON line each way, so both sides share one reward and one clock:

- rewards: the reward function writes ``@@{"event": "score", "completions": [...], "answers": [...]}`` and reads
  back a JSON list of rewards (the parent scores with llmrl's own parser, so both sides earn the same reward);
- after each optimizer step the policy's weights are written to ``OUT/step-<N>.safetensors`` (in ``--dtype``,
  the parent's choice: bf16 where the CPU has bf16, else fp32, as the evaluation engine runs) and
  ``@@{"event": "step", "step": N, "time": wall clock at the step's end, "save_s": seconds spent writing}`` is
  printed; the parent takes the writes off TRL's clock.

TRL's logged metrics (reward, loss, grad_norm, ...) come as ``@@{"event": "log", ...}``; ``done`` at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import trl
from datasets import Dataset
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer


def emit(**message) -> None:
    print("@@" + json.dumps(message), flush=True)


def parent_rewards(completions: list[str], answer: list[str], **_: object) -> list[float]:
    """The parent's reward for each completion (llmrl's parser, the one both sides train with)."""
    emit(event="score", completions=list(completions), answers=list(answer))
    reply = sys.stdin.readline()
    if not reply:
        raise SystemExit("the parent closed stdin")
    rewards = json.loads(reply)
    if len(rewards) != len(completions):
        raise SystemExit(f"the parent returned {len(rewards)} rewards for {len(completions)} completions")
    return [float(r) for r in rewards]


class SaveEachStep(TrainerCallback):
    """Writes the policy's weights after every optimizer step and reports the step's end on the wall clock."""

    def __init__(self, out: Path, dtype: torch.dtype) -> None:
        self.out = out
        self.dtype = dtype
        self.model: torch.nn.Module | None = None

    def on_step_end(self, args, state, control, model=None, **kwargs):
        ended = time.time()
        began = time.perf_counter()
        weights = {k: v.detach().to(self.dtype, copy=True) for k, v in (model or self.model).state_dict().items()}
        tmp = self.out / f"step-{state.global_step}.safetensors.tmp"
        save_file(weights, str(tmp))
        tmp.replace(self.out / f"step-{state.global_step}.safetensors")
        emit(event="step", step=state.global_step, time=ended, save_s=time.perf_counter() - began)
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        values = {k: v for k, v in (logs or {}).items() if isinstance(v, float | int)}
        emit(event="log", step=state.global_step, **values)
        return control


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--seed", type=int, default=0, help="TRL's seed (its sampling and initial state)")
    args = parser.parse_args()
    data = json.loads(Path(args.data).read_text(encoding="utf-8"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    group = int(data["group_size"])
    prompts_per_step = int(data["prompts_per_step"])
    config = GRPOConfig(
        output_dir=str(out / "trainer"),
        use_cpu=True,
        bf16=args.dtype == "bf16",
        per_device_train_batch_size=prompts_per_step * group,  # one generation batch, one optimizer step
        gradient_accumulation_steps=1,
        num_generations=group,
        max_completion_length=int(data["max_completion_length"]),
        temperature=float(data["temperature"]),
        top_p=1.0,
        learning_rate=float(data["lr"]),
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=float(data["max_grad_norm"]),
        weight_decay=0.0,
        beta=0.0,
        epsilon=float(data["clip_epsilon"]),
        loss_type="dapo",  # token mean over the batch's completion tokens (llmrl: token_mean)
        scale_rewards="group",  # (r - group mean) / group std, as llmrl's advantage "grpo"
        num_iterations=1,
        shuffle_dataset=False,  # llmrl's served order, one group per prompt
        gradient_checkpointing=False,
        disable_dropout=True,
        max_steps=args.steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=args.seed,
    )
    dataset = Dataset.from_dict({"prompt": data["prompts"], "answer": data["answers"]})
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=parent_rewards,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[SaveEachStep(out, torch.bfloat16 if args.dtype == "bf16" else torch.float32)],
    )
    emit(
        event="setup",
        trl=trl.__version__,
        torch=torch.__version__,
        transformers=__import__("transformers").__version__,
        threads=torch.get_num_threads(),
        generation="transformers",
        optim=str(config.optim),
    )
    trainer.train()
    emit(event="done")


if __name__ == "__main__":
    main()
