"""TransformersWrapper and vLLMWrapper: same interface, valid samples, agreeing log-probs."""

from __future__ import annotations

import pytest
import torch

from llmrl_core.data import Conversation, ConversationBatch, LLMData
from llmrl_core.policies.base import SamplingConfig
from llmrl_core.policies.transformers_wrapper import TransformersWrapper
from llmrl_core.policies.vllm_wrapper import vLLMWrapper

CHATS = [
    [{"role": "user", "content": "What is 2+3?"}],
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a primary color."}],
    [{"role": "user", "content": "Count from one to five."}],
]


def _data() -> LLMData:
    return LLMData(history=ConversationBatch([Conversation.from_chats(c) for c in CHATS]))


@pytest.fixture(scope="module")
def hf_policy(hf_model_fp32):
    model, tokenizer = hf_model_fp32
    return TransformersWrapper(model, tokenizer, sampling=SamplingConfig(max_new_tokens=24, temperature=1.0, seed=3))


@pytest.fixture(scope="module")
def vllm_policy(vllm_engine_fp32):
    return vLLMWrapper(vllm_engine_fp32, sampling=SamplingConfig(max_new_tokens=24, temperature=1.0, seed=3))


def _check_valid(out, tokenizer, max_new_tokens=24):
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert len(out.text_response) == len(CHATS)
    for text, tokens, lps, reason in zip(
        out.text_response, out.tokens_response, out.log_probs, out.finish_reasons, strict=True
    ):
        assert 0 < len(tokens) <= max_new_tokens
        assert lps.shape == tokens.shape and torch.all(lps <= 0) and torch.all(torch.isfinite(lps))
        assert reason in {"stop", "length"}
        assert (reason == "stop") == (tokens[-1].item() == eos)
        assert tokenizer.decode(tokens.tolist(), skip_special_tokens=True) == text


def test_both_backends_sample_valid_responses(hf_policy, vllm_policy):
    _check_valid(hf_policy(_data()), hf_policy.tokenizer)
    _check_valid(vllm_policy(_data()), vllm_policy.tokenizer)


def test_log_probs_agree_across_backends(hf_policy, vllm_policy):
    """Each backend's sampler log-probs match the other backend's teacher-forced scores (fp32)."""
    for sampler, scorer in ((vllm_policy, hf_policy), (hf_policy, vllm_policy)):
        out = sampler(_data())
        scores = scorer.score([p.tolist() for p in out.tokens], [r.tolist() for r in out.tokens_response])
        diffs = torch.cat([(a - b).abs() for a, b in zip(scores, out.log_probs, strict=True)])
        assert diffs.mean().item() < 1e-3 and diffs.max().item() < 1e-2, (type(sampler).__name__, diffs.max())


def test_prompts_are_identical_in_every_input_mode(hf_policy, hf_model_fp32):
    _, tokenizer = hf_model_fp32
    data = _data()
    ids = hf_policy.prompt_token_ids(data)
    texts = [h.apply_chat_template(tokenizer, add_generation_prompt=True) for h in data.history]
    as_text = TransformersWrapper(hf_policy.model, tokenizer, input_mode="text")
    as_tokens = TransformersWrapper(hf_policy.model, tokenizer, input_mode="tokens")
    assert as_text.prompt_token_ids(LLMData(text=texts)) == ids
    assert as_tokens.prompt_token_ids(LLMData(tokens=[torch.tensor(i) for i in ids])) == ids
    with pytest.raises(ValueError, match="input_mode='tokens' but the data has no tokens"):
        as_tokens(data)


def test_scoring_mode_log_probs_and_entropy_match_a_direct_forward(hf_model_fp32):
    model, tokenizer = hf_model_fp32
    scorer = TransformersWrapper(model, tokenizer, generate=False, return_entropy=True, pad_output=True)
    responses = [tokenizer(r, add_special_tokens=False)["input_ids"] for r in ["2 + 3 = 5.", "Red.", "One two"]]
    out = scorer(_data(), responses=responses)
    for prompt, response, lps, ent in zip(out.tokens, responses, out.log_probs, out.entropy, strict=True):
        ids = torch.tensor([prompt.tolist() + response])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0].float(), -1)[len(prompt) - 1 : -1]
        expected = logp.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)
        # packed vs unpacked forward: other matmul shapes, ~1.2e-5 apart in fp32 on an AVX-512 CPU
        torch.testing.assert_close(lps, expected, atol=5e-5, rtol=0)
        torch.testing.assert_close(ent, -(logp.exp() * logp).sum(-1), atol=1e-4, rtol=0)
    padded = out.padded
    assert padded.tokens.shape == padded.log_probs.shape == padded.mask.shape == (3, max(map(len, responses)))
    assert padded.mask.sum(1).tolist() == [len(r) for r in responses]
    assert torch.equal(padded.log_probs[~padded.mask], torch.zeros(int((~padded.mask).sum())))


def test_greedy_generation_is_deterministic_and_backends_agree(hf_model_fp32, vllm_engine_fp32):
    model, tokenizer = hf_model_fp32
    greedy = SamplingConfig(max_new_tokens=16, temperature=0.0)
    hf_out = TransformersWrapper(model, tokenizer, sampling=greedy)(_data())
    vllm_out = vLLMWrapper(vllm_engine_fp32, sampling=greedy)(_data())
    assert hf_out.text_response == vllm_out.text_response
    assert [t.tolist() for t in hf_out.tokens_response] == [t.tolist() for t in vllm_out.tokens_response]


def test_bad_sampling_settings_are_rejected():
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(top_p=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingConfig(max_new_tokens=0)


def test_llm_on_device_rejects_unknown_devices():
    from llmrl_core.policies.vllm_worker import LLMOnDevice

    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda"):
        LLMOnDevice(device="tpu:0")
