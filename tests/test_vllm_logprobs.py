"""vLLM on the packaged model: generation with per-token log-probs that match transformers."""

from __future__ import annotations

import torch

from llmrl_core.builtin_data import load_gsm8k
from llmrl_core.modules.backends.transformers.scoring import render_chat_prompt, score_response_tokens
from llmrl_core.modules.backends.vllm.engine import generate


def _gsm8k_prompts(tokenizer, n):
    return [render_chat_prompt(tokenizer, [{"role": "user", "content": r["question"]}]) for r in load_gsm8k("test", n)]


def test_vllm_generates_with_per_token_logprobs(vllm_engine_fp32, hf_model_fp32):
    _, tokenizer = hf_model_fp32
    prompts = _gsm8k_prompts(tokenizer, 4)
    results = generate(vllm_engine_fp32, prompts, max_tokens=32, temperature=1.0, n=2, seed=1)
    assert len(results) == 4
    for prompt, group in zip(prompts, results, strict=True):
        assert len(group) == 2
        for completion in group:
            assert completion.prompt_token_ids == prompt
            assert 0 < len(completion.token_ids) <= 32
            assert len(completion.logprobs) == len(completion.token_ids)
            assert all(lp <= 0.0 and lp > -50 for lp in completion.logprobs)
            assert completion.finish_reason in {"stop", "length"}
            assert tokenizer.decode(completion.token_ids, skip_special_tokens=True).strip() == completion.text.strip()


def test_vllm_logprobs_agree_with_transformers_fp32(vllm_engine_fp32, hf_model_fp32):
    model, tokenizer = hf_model_fp32
    prompts = _gsm8k_prompts(tokenizer, 8)
    results = generate(vllm_engine_fp32, prompts, max_tokens=48, temperature=1.0, seed=0)
    diffs = []
    for prompt, [completion] in zip(prompts, results, strict=True):
        reference = score_response_tokens(model, prompt, completion.token_ids)
        diffs.append((reference - torch.tensor(completion.logprobs)).abs())
    diffs = torch.cat(diffs)
    assert diffs.numel() >= 8 * 10
    assert diffs.mean().item() < 1e-3, diffs.mean().item()
    assert diffs.max().item() < 1e-2, diffs.max().item()


def test_greedy_vllm_answer_contains_5(vllm_engine_fp32, hf_model_fp32):
    _, tokenizer = hf_model_fp32
    prompt = render_chat_prompt(tokenizer, [{"role": "user", "content": "What is 2+3?"}])
    [[completion]] = generate(vllm_engine_fp32, [prompt], max_tokens=24, temperature=0.0)
    assert "5" in completion.text, completion.text


def test_seeded_sampling_differs_across_repeated_prompts_and_repeats_across_calls(vllm_engine_fp32):
    """The G copies of a GRPO group are separate requests: one shared seed would give G identical samples."""
    tokenizer = vllm_engine_fp32.get_tokenizer()
    ids = render_chat_prompt(tokenizer, [{"role": "user", "content": "Tell me a story about a cat."}])
    first = generate(vllm_engine_fp32, [ids] * 6, max_tokens=12, temperature=1.0, seed=5)
    again = generate(vllm_engine_fp32, [ids] * 6, max_tokens=12, temperature=1.0, seed=5)
    samples = [tuple(group[0].token_ids) for group in first]
    assert len(set(samples)) >= 5
    assert samples == [tuple(group[0].token_ids) for group in again]
    # stop strings reach the sampler
    stopped = generate(vllm_engine_fp32, [ids], max_tokens=40, temperature=0.0, stop=[" "])
    assert " " not in stopped[0][0].text and stopped[0][0].finish_reason == "stop"


def test_processed_logprobs_at_temperature_match_the_trainer_scoring_at_that_temperature(
    vllm_engine_fp32, hf_model_fp32
):
    """At T = 0.7 the engine records the log-probs of the distribution it sampled from (logits / T), and the
    trainer's packed scoring at the row's temperature gives the same numbers; at T = 1 it would not."""
    from llmrl_core.trainer.batch import TrainSample, pack_samples
    from llmrl_core.trainer.scoring import score_packed

    model, tokenizer = hf_model_fp32
    prompts = _gsm8k_prompts(tokenizer, 6)
    results = generate(vllm_engine_fp32, prompts, max_tokens=40, temperature=0.7, seed=3)
    samples = [
        TrainSample(prompt, completion.token_ids, sampler_logprobs=completion.logprobs, temperature=0.7)
        for prompt, [completion] in zip(prompts, results, strict=True)
    ]
    batch = pack_samples(samples)
    with torch.no_grad():
        at_t = score_packed(model, batch).log_probs  # per-sample temperatures (0.7)
        raw = score_packed(model, batch, temperature=1.0).log_probs
    mask = batch.mask
    gap = (at_t - batch.sampler_log_probs)[mask].abs()
    gap_raw = (raw - batch.sampler_log_probs)[mask].abs()
    assert gap.numel() >= 6 * 10
    assert gap.mean().item() < 1e-3, gap.mean().item()
    assert gap.max().item() < 1e-2, gap.max().item()
    assert gap_raw.mean().item() > 20 * gap.mean().item()  # raw (T = 1) scoring is another policy
