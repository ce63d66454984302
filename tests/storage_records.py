"""Realistic trajectory records for the storage tests: GSM8K prompts, real tokenizer ids, group rewards."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np

from llmrl_core.builtin_data import gsm8k_gold, load_gsm8k
from storage.schema import TrajectoryRecord

CREATED_AT = dt.datetime(2026, 11, 21, 9, 0, 0, 123456, tzinfo=dt.UTC)


def _ids(tokenizer, text: str) -> list[int]:
    if tokenizer is None:
        return [ord(c) % 49152 for c in text]
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def make_records(
    run_id: str, policy_version: int, *, n_prompts: int = 2, group_size: int = 4, tokenizer=None, seed: int = 0
) -> list[TrajectoryRecord]:
    """One GRPO group per GSM8K test question; every 4th sample is a two-turn tool call (masked tool tokens)."""
    rng = np.random.default_rng(seed + 1000 * policy_version)
    records = []
    for p, row in enumerate(load_gsm8k("test", limit=n_prompts)):
        gold = gsm8k_gold(row["answer"]).replace(",", "")  # "2,125" -> "2125" (a few answers use commas)
        user = {"role": "user", "content": row["question"]}
        if tokenizer is not None:
            prompt_text = tokenizer.apply_chat_template([user], add_generation_prompt=True, tokenize=False)
        else:
            prompt_text = row["question"]
        prompt_tokens = _ids(tokenizer, prompt_text)
        rewards = []
        group = []
        for s in range(group_size):
            correct = (s + p + policy_version) % 3 == 0
            answer = f"The answer is <answer>{gold if correct else int(gold) + s + 1}</answer>."
            messages = [user]
            tool_calls = []
            if s % 4 == 3:
                call = {"turn": 0, "name": "python", "arguments": json.dumps({"code": f"print({gold})"})}
                tool_calls.append({**call, "result": f"{gold}\n", "error": False})
                messages = [user, {"role": "assistant", "content": "<tool>python</tool>"}]
                messages.append({"role": "tool", "content": f"{gold}\n"})
                first, tool = _ids(tokenizer, "<tool>python</tool>"), _ids(tokenizer, f"{gold}\n")
                final = _ids(tokenizer, answer)
                response = first + tool + final
                mask = [True] * len(first) + [False] * len(tool) + [True] * len(final)
            else:
                response = _ids(tokenizer, answer)
                mask = [True] * len(response)
            messages = [*messages, {"role": "assistant", "content": answer}]
            logprobs = (-rng.exponential(0.8, size=len(response))).astype(np.float32)
            ref = (logprobs - rng.uniform(0, 0.1, size=len(response))).astype(np.float32)
            reward = (1.0 if correct else 0.0) + 0.1
            rewards.append(reward)
            group.append(
                TrajectoryRecord(
                    run_id=run_id,
                    policy_version=policy_version,
                    prompt_id=f"gsm8k-test-{p:04d}",
                    group_id=f"v{policy_version}-g{p}",
                    sample_index=s,
                    turn=1 if tool_calls else 0,
                    messages=messages,
                    prompt_tokens=prompt_tokens,
                    response_tokens=response,
                    response_mask=mask,
                    sampler_logprobs=[float(x) for x in logprobs],
                    ref_logprobs=[float(x) for x in ref] if s % 2 == 0 else None,
                    reward=reward,
                    reward_components={"correct": 1.0 if correct else 0.0, "format": 0.1},
                    finish_reason="stop" if s != 1 else "length",
                    truncated=s == 1,
                    num_tool_calls=len(tool_calls),
                    tool_calls=tool_calls,
                    model_id="SmolLM2-135M-Instruct",
                    sampling_params={"temperature": 0.7, "top_p": 1.0, "max_tokens": 128, "seed": seed},
                    created_at=CREATED_AT,
                )
            )
        mean, std = float(np.mean(rewards)), float(np.std(rewards))
        for record in group:
            record.advantage = (record.reward - mean) / (std + 1e-6)
        records.extend(group)
    return records
