"""Trainer log-probs vs the sampler's, and GRPO train-step speed, fp32 against bf16 autocast (CPU or CUDA).

The sampler is transformers' own ``generate`` in fp32 at temperature T (its processed scores, logits / T, are
what vLLM's ``processed_logprobs`` record), so the script runs where vLLM is not installed (e.g. a GPU machine
with torch and transformers only). Printed: mean and max |trainer - sampler| log-prob for an fp32 and a bf16
autocast trainer at T, then GRPO train-step tokens/s (median and min of 3 after a warm-up) and their ratio.

    .venv/bin/python bench/bench_trainer_agreement.py [--device cuda] [--prompts 32] [--max-new-tokens 96]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from llmrl_core.builtin_data import load_gsm8k
from llmrl_core.model_store import ensure_default_model
from llmrl_core.objectives import GRPOLoss
from llmrl_core.trainer import Trainer, TrainerConfig
from llmrl_core.trainer.batch import TrainSample, pack_samples
from llmrl_core.trainer.scoring import score_packed


def sample(model, tok, device, n, max_new_tokens, temperature):
    """``n`` GSM8K answers sampled at ``temperature`` with their processed log-probs (one row each)."""
    samples = []
    torch.manual_seed(0)
    for row in load_gsm8k("test", n):
        messages = [{"role": "user", "content": row["question"]}]
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
        ids = (ids["input_ids"] if hasattr(ids, "keys") else ids).to(device)
        with torch.no_grad():
            out = model.generate(
                ids,
                do_sample=True,
                temperature=temperature,
                top_p=1.0,
                top_k=0,
                max_new_tokens=max_new_tokens,
                output_scores=True,
                return_dict_in_generate=True,
                pad_token_id=tok.eos_token_id,
            )
        response = out.sequences[0, ids.shape[1] :]
        lps = [torch.log_softmax(s[0].float(), -1)[t].item() for s, t in zip(out.scores, response, strict=False)]
        samples.append(TrainSample(ids[0].tolist(), response.tolist(), sampler_logprobs=lps, temperature=temperature))
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=0.7)
    args = parser.parse_args()
    path = str(ensure_default_model())
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(args.device).eval()
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    print(f"device {name}, torch {torch.__version__}, T={args.temperature}")
    samples = sample(model, tok, args.device, args.prompts, args.max_new_tokens, args.temperature)
    batch = pack_samples(samples).to(args.device)
    for label, ctx in (
        ("fp32", contextlib.nullcontext()),
        ("bf16", torch.autocast(args.device, dtype=torch.bfloat16)),
    ):
        with torch.no_grad(), ctx:
            lp = score_packed(model, batch).log_probs
        gap = (lp - batch.sampler_log_probs)[batch.mask].abs()
        summary = f"mean |dlogp| {gap.mean():.2e}, max {gap.max():.2e} ({gap.numel()} tokens)"
        print(f"trainer {label} vs fp32 sampler: {summary}")
    rows = samples + samples
    for i, s in enumerate(rows):
        s.advantage = 1.0 if i % 2 else -1.0
    speed = {}
    for mode in ("no", "bf16"):
        m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(args.device)
        trainer = Trainer(GRPOLoss(m, entropy_bonus=False), TrainerConfig(lr=1e-6, mixed_precision=mode))
        trainer.train_step(rows)  # warm-up
        times = []
        for _ in range(3):
            if args.device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            metrics = trainer.train_step(rows)
            if args.device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        speed[mode] = metrics["num_tokens"] / statistics.median(times)
        print(
            f"GRPO train step, mixed_precision={mode}: {metrics['num_tokens']:.0f} tokens, "
            f"median {statistics.median(times):.3f} s, min {min(times):.3f} s, {speed[mode]:.0f} tok/s"
        )
    print(f"bf16 / fp32 train-step speed: {speed['bf16'] / speed['no']:.2f}x")


if __name__ == "__main__":
    main()
