"""Trajectory rows for the SFT / offline flow tests: GSM8K train prompts as the GRPO env renders them, the
packaged model's real token ids, and its own fp32 log-probs as the sampler log-probs."""

from __future__ import annotations

import torch

from llmrl_core.builtin_data import load_gsm8k
from llmrl_core.envs.gsm8k import GSM8K_QUESTION_TEMPLATE, GSM8K_SYSTEM_PROMPT
from llmrl_core.trainer.batch import TrainSample, pack_samples
from llmrl_core.trainer.scoring import score_packed
from storage.schema import TrajectoryRecord
from tasks.sft_stages import tokenize_chat


def gsm8k_records(
    model, tokenizer, run_id: str, version: int, responses: dict[int, list[tuple[str, float]]]
) -> list[TrajectoryRecord]:
    """One group per GSM8K train row index in ``responses``: ``(assistant text, stored reward)`` per sample."""
    rows = load_gsm8k("train", limit=max(responses) + 1)
    records = []
    for prompt_index, samples in responses.items():
        question = rows[prompt_index]["question"]
        for k, (text, reward) in enumerate(samples):
            messages = [
                {"role": "system", "content": GSM8K_SYSTEM_PROMPT},
                {"role": "user", "content": GSM8K_QUESTION_TEMPLATE.format(question=question)},
                {"role": "assistant", "content": text},
            ]
            sample, _ = tokenize_chat(messages, tokenizer, 4096, f"p{prompt_index}#{k}")
            with torch.no_grad():
                scores = score_packed(model, pack_samples([TrainSample(sample.prompt_ids, sample.response_ids)]))
            records.append(
                TrajectoryRecord(
                    run_id=run_id,
                    policy_version=version,
                    prompt_id=str(prompt_index),
                    group_id=str(prompt_index),
                    sample_index=k,
                    messages=messages,
                    prompt_tokens=sample.prompt_ids,
                    response_tokens=sample.response_ids,
                    response_mask=sample.response_mask,
                    sampler_logprobs=scores.log_probs[0, : len(sample.response_ids)].tolist(),
                    reward=reward,
                    finish_reason="stop",
                    model_id="default",
                    advantage=0.0,
                )
            )
    return records
