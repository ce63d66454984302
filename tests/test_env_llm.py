"""LLMEnv (text/token completion env) and LLMHashingEnv (hash-identified token chains)."""

from __future__ import annotations

import pytest
import torch

from llmrl_core.envs import DataLoadingPrimer, LLMEnv, LLMHashingEnv
from llmrl_core.envs.hashing_env import blake2b_chain


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path)


def test_llm_env_text_mode_appends_and_stops_on_eos(tokenizer):
    env = LLMEnv(tokenizer=tokenizer, eos_token_id=tokenizer.eos_token_id)
    out = env.reset(["2+2=", "Hi"])
    assert out.observation == ["2+2=", "Hi"] and not out.done.any()
    out = env.step(["4", " there"])
    assert out.observation == ["2+2=4", "Hi there"] and not out.done.any()
    out = env.step(["<|im_end|>", "!"])
    assert out.done.tolist() == [True, False] and out.terminated.tolist() == [True, False]
    out = env.step(["ignored", "?"])
    assert out.observation == ["2+2=4<|im_end|>", "Hi there!?"]


def test_llm_env_token_mode_and_max_length():
    env = LLMEnv(from_text=False, eos_token_id=2, max_length=5)
    env.reset([torch.tensor([5, 6]), [7]])
    out = env.step([torch.tensor([8, 2]), torch.tensor([9])])
    assert [o.tolist() for o in out.observation] == [[5, 6, 8, 2], [7, 9]] and out.done.tolist() == [True, False]
    out = env.step([torch.tensor([1]), torch.tensor([10, 11, 12, 13])])
    assert out.observation[1].tolist() == [7, 9, 10, 11, 12] and out.truncated.tolist() == [False, True]
    with pytest.raises(ValueError, match="eos_token_id is set but text actions come without tokens"):
        e = LLMEnv(eos_token_id=2)
        e.reset(["a"])
        e.step(["b"])


def test_llm_env_from_primer():
    primer = DataLoadingPrimer([{"query": "a"}, {"query": "b"}], batch_size=2, shuffle=False)
    env = LLMEnv(primer=primer)
    assert env.reset().observation == ["a", "b"]


def test_hashing_env_reset_and_step_agree(tokenizer):
    env = LLMHashingEnv(tokenizer=tokenizer)
    assert env.vocab_size == len(tokenizer)
    prompt = tokenizer("Check out llmrl", add_special_tokens=False)["input_ids"]
    out = env.reset([prompt[:-1], prompt[:-1]])
    assert out.text[0] == tokenizer.decode(prompt[:-1])
    stepped = env.step(torch.tensor([[prompt[-1]], [prompt[-2]]]))
    direct = LLMHashingEnv(tokenizer=tokenizer).reset([prompt])
    assert stepped.hashing[0] == direct.hashing[0]  # same chain, same id
    assert stepped.hashing[1] != stepped.hashing[0]  # different last token, different id
    assert stepped.observation[0].tolist() == prompt and stepped.text[0] == tokenizer.decode(prompt)
    # the chain is the fold of the step function over the tokens
    value = 0
    for t in prompt:
        value = blake2b_chain(value, t)
    assert direct.hashing.tolist() == [value] and direct.hashing.dtype == torch.int64


def test_hashing_env_checks_ids():
    env = LLMHashingEnv(10, text_output=False)
    env.reset([[1, 2]])
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 10\)"):
        env.step([10])
    with pytest.raises(TypeError, match="vocab_size or a tokenizer"):
        LLMHashingEnv()
