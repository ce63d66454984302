"""Trainer log-probs vs the sampler's, and GRPO train-step speed, fp32 against bf16 autocast (CPU or CUDA).

The sampler is llmrl's Transformers engine (``rollout.backend: transformers``,
:class:`~llmrl_core.modules.backends.transformers.worker.TransformersWorker`)
at temperature T, recording the log-probs of
the distribution it sampled from (as vLLM's ``processed_logprobs``), in fp32 and in bf16; so the script runs where
vLLM is not installed (e.g. a GPU machine with torch and transformers only). Printed: the engine's sampling speed,
mean and max |trainer - sampler| log-prob for an fp32 and a bf16 autocast trainer against each engine, then GRPO
train-step tokens/s (median and min of 3 after a warm-up) and their ratio.

    .venv/bin/python bench/bench_trainer_agreement.py [--device cuda] [--prompts 32] [--max-new-tokens 96]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

from llmrl_core.builtin_data import load_gsm8k
from llmrl_core.model_store import ensure_default_model
from llmrl_core.modules.backends.transformers.scoring import render_chat_prompt
from llmrl_core.modules.backends.transformers.worker import TransformersWorker
from llmrl_core.modules.backends.types import EngineConfig, SamplingConfig
from llmrl_core.objectives import GRPOLoss
from llmrl_core.trainer import Trainer, TrainerConfig
from llmrl_core.trainer.batch import TrainSample, pack_samples
from llmrl_core.trainer.scoring import score_packed


def sample(engine, n, max_new_tokens, temperature):
    """``n`` GSM8K answers sampled at ``temperature`` by ``engine``, with their log-probs; and the tokens/s."""
    tok = engine.get_tokenizer()
    prompts = [render_chat_prompt(tok, [{"role": "user", "content": r["question"]}]) for r in load_gsm8k("test", n)]
    start = time.perf_counter()
    groups = engine.generate(prompts, SamplingConfig(max_new_tokens, temperature, seed=0))
    elapsed = time.perf_counter() - start
    completions = [c for group in groups for c in group]
    samples = [
        TrainSample(c.prompt_token_ids, c.token_ids, sampler_logprobs=c.logprobs, temperature=temperature)
        for c in completions
    ]
    return samples, sum(len(c.token_ids) for c in completions) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=0.7)
    args = parser.parse_args()
    path = str(ensure_default_model())
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(args.device).eval()
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    print(f"device {name}, torch {torch.__version__}, T={args.temperature}")
    by_engine = {}
    for dtype in ("float32", "bfloat16"):
        engine = TransformersWorker(EngineConfig(model=path, dtype=dtype, device=args.device))
        by_engine[dtype], speed = sample(engine, args.prompts, args.max_new_tokens, args.temperature)
        engine.close()
        print(f"{dtype} engine: {args.prompts} answers sampled in one batch, {speed:.0f} new tokens/s")
        batch = pack_samples(by_engine[dtype]).to(args.device)
        for label, ctx in (
            ("fp32", contextlib.nullcontext()),
            ("bf16", torch.autocast(args.device, dtype=torch.bfloat16)),
        ):
            with torch.no_grad(), ctx:
                lp = score_packed(model, batch).log_probs
            gap = (lp - batch.sampler_log_probs)[batch.mask].abs()
            summary = f"mean |dlogp| {gap.mean():.2e}, max {gap.max():.2e} ({gap.numel()} tokens)"
            print(f"trainer {label} vs {dtype} engine: {summary}")
    samples = by_engine["float32"]
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
