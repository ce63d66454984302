"""One stored GRPO batch, two gradients: llmrl's trainer against TRL's loss written out by hand (issue 32's "same
algorithm, so per-step learning must agree": this separates the algorithm from the data).

Reads one version's rows of a run (``llmrl run grpo`` stores them; their advantages are set), then computes in fp32
with no autocast, from the same starting weights (the run's model, default the packaged SmolLM2):

- llmrl: :class:`~llmrl_core.trainer.Trainer` with :class:`~llmrl_core.objectives.GRPOLoss` (PPO clip, token mean,
  the ratio against the sampler's stored log-probs), over the rows the flow trains on (``--all-rows``: every row);
- TRL's ``loss_type="dapo"`` at its first pass (ratio 1: the gradient of ``-A * log p`` per completion token,
  divided by the batch's completion tokens), log-probs at the sampling temperature as TRL scores them.

Printed: the rows and groups with signal, the cosine of the two gradients, their norms, and the share of weights
whose gradient has the same sign in both (AdamW's first step moves every weight by ``lr * sign(gradient)``, so
that share says how alike the two first updates are).

    .venv/bin/python bench/bench_same_batch_gradient.py --runs-dir runs --run-id arithmetic-quickstart --version 0
"""

from __future__ import annotations

import argparse
import collections

import torch
from transformers import AutoModelForCausalLM

from llmrl_core.model_store import resolve_model
from llmrl_core.objectives import GRPOLoss
from llmrl_core.trainer import Trainer, TrainerConfig
from runtime.records import record_to_sample
from storage.trajectories import TrajectoryStore


def _gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def llmrl_gradient(model_path: str, rows: list, token_budget: int) -> dict[str, torch.Tensor]:
    """The gradient llmrl's trainer accumulates on ``rows`` (before clipping and the optimizer step)."""
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    trainer = Trainer(GRPOLoss(model, clip_epsilon=0.2), TrainerConfig(token_budget=token_budget, mixed_precision="no"))
    batches = trainer.micro_batches([record_to_sample(r) for r in rows])
    trainer.accumulate(batches, trainer.batch_units(batches), with_grad=True)
    return _gradients(model)


def trl_dapo_gradient(model_path: str, rows: list) -> dict[str, torch.Tensor]:
    """TRL's dapo loss at ratio 1, by hand: ``-sum(A * log p over completion tokens) / completion tokens``."""
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    total = sum(sum(r.response_mask) for r in rows)
    for row in rows:
        sample = record_to_sample(row)
        ids = torch.tensor([row.prompt_tokens + row.response_tokens])
        logits = model(ids).logits[0, len(row.prompt_tokens) - 1 : -1] / (sample.temperature or 1.0)
        log_probs = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(row.response_tokens)[:, None])[:, 0]
        mask = torch.tensor(row.response_mask, dtype=torch.float32)
        (-float(row.advantage) * (log_probs * mask).sum() / total).backward()
    return _gradients(model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs-dir", default="runs")
    parser.add_argument("--run-id", default="arithmetic-quickstart")
    parser.add_argument("--version", type=int, default=0)
    parser.add_argument("--model", default="default")
    parser.add_argument("--token-budget", type=int, default=1024)
    parser.add_argument("--all-rows", action="store_true", help="llmrl trains on every row (no zero-signal skip)")
    args = parser.parse_args()
    rows = TrajectoryStore(f"{args.runs_dir}/trajectories").read_records(args.run_id, version=args.version)
    if not rows or any(r.advantage is None for r in rows):
        raise SystemExit(f"{args.run_id} v{args.version}: no rows, or rows without advantages")
    groups = collections.defaultdict(list)
    for row in rows:
        groups[row.group_id].append(row.reward)
    signal = {g for g, rewards in groups.items() if len(set(rewards)) > 1}
    trained = rows if args.all_rows else [r for r in rows if r.group_id in signal]
    print(f"{len(rows)} rows in {len(groups)} groups; {len(signal)} groups with signal; llmrl trains on {len(trained)}")
    model_path = str(resolve_model(args.model))
    ours, theirs = llmrl_gradient(model_path, trained, args.token_budget), trl_dapo_gradient(model_path, rows)
    dot = sum(float((ours[n] * theirs[n]).sum()) for n in ours)
    norm_ours = sum(float((g**2).sum()) for g in ours.values()) ** 0.5
    norm_theirs = sum(float((g**2).sum()) for g in theirs.values()) ** 0.5
    same_sign = sum(int(((ours[n] > 0) == (theirs[n] > 0)).sum()) for n in ours) / sum(g.numel() for g in ours.values())
    cosine = dot / (norm_ours * norm_theirs)
    print(f"cosine {cosine:.4f}   norm llmrl {norm_ours:.4g}   norm TRL-dapo {norm_theirs:.4g}")
    print(f"weights whose gradient has the same sign: {same_sign:.4f}")


if __name__ == "__main__":
    main()
