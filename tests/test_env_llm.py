"""LLMEnv (text/token completion env on ChatEnv) and LLMHashingEnv (hash-identified token chains)."""

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
    assert out.text == ["2+2=", "Hi"] and not out.done.any()
    out = env.step(["4", " there"])
    assert out.text == ["2+2=4", "Hi there"] and not out.done.any()
    out = env.step(["<|im_end|>", "!"])
    assert out.done.tolist() == [True, False] and out.terminated.tolist() == [True, False]
    out = env.step([None, "?"])  # a finished slot takes no action
    assert out.text == ["2+2=4<|im_end|>", "Hi there!?"]
    # the conversation behind the observation: the prompt as the user's turn, each answer as the policy's
    assert [m.role for m in out.history[1].messages] == ["user", "assistant", "assistant", "assistant"]


def test_llm_env_token_mode_keeps_ids_and_max_length(tokenizer):
    env = LLMEnv(from_text=False, tokenizer=tokenizer, eos_token_id=2, max_length=5)
    out = env.reset([torch.tensor([5, 6]), [7]])
    assert [t.tolist() for t in out.tokens] == [[5, 6], [7]]
    out = env.step([torch.tensor([8, 2]), torch.tensor([9])])
    assert [t.tolist() for t in out.tokens] == [[5, 6, 8, 2], [7, 9]] and out.done.tolist() == [True, False]
    out = env.step([None, torch.tensor([10, 11, 12, 13])])
    assert out.tokens[1].tolist() == [7, 9, 10, 11, 12, 13] and out.truncated.tolist() == [False, True]
    with pytest.raises(ValueError, match="needs a tokenizer"):
        LLMEnv(from_text=False)
    with pytest.raises(ValueError, match="eos_token_id is set but text actions come without tokens"):
        e = LLMEnv(eos_token_id=2)
        e.reset(["a"])
        e.step(["b"])


def test_llm_env_from_primer():
    primer = DataLoadingPrimer([{"query": "a"}, {"query": "b"}], batch_size=2, shuffle=False)
    env = LLMEnv(primer=primer, str_key="query")
    assert env.reset().text == ["a", "b"]


def test_llm_env_from_an_endless_loader_as_torchrl():
    """TorchRL's ``LLMEnv.from_dataloader`` over an endless iterator of string batches (never materialised); an
    empty TensorDict reset draws the next prompts and fills it in TorchRL's layout."""
    from tensordict import TensorDict

    class Words:
        def __init__(self):
            self.n = 0

        def __iter__(self):
            return self

        def __next__(self):
            self.n += 1
            return [f"w{self.n}"]

    loader = Words()
    env = LLMEnv.from_dataloader(loader, batch_size=2, repeats=2)  # group_repeats=True: 2 prompts x 2 copies
    assert env.batch_size == (4,) and loader.n == 0
    out = env.reset()
    assert out.text == ["w1", "w1", "w2", "w2"] and out.group_id == [0, 0, 1, 1] and loader.n == 2
    td = env.reset(TensorDict())
    assert td.batch_size == (4,) and td["text"].prompt == ["w3", "w3", "w4", "w4"]
    assert td["history"].prompt[0].to_messages()[0].role == "user"
    with pytest.raises(ValueError, match="primers= takes TorchRL specs"):
        LLMEnv.from_dataloader(loader, primers={"x": 1})


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


def test_as_llm_data_is_refused_by_name():
    LLMEnv(as_llm_data=False)  # TorchRL's default, accepted
    with pytest.raises(ValueError, match=r"as_llm_data=True\) .* is not supported"):
        LLMEnv(as_llm_data=True)
