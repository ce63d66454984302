"""ChatEnv's TensorDict door (TorchRL's calls): reset from a TensorDict of queries, step from a TensorDict of
answers, TorchRL's keys and shapes, and the documented errors."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from llmrl_core.data import History
from llmrl_core.envs import ChatEnv
from llmrl_core.modules.policies import ChatHistory

SYSTEM = "You are a helpful assistant."


def test_reset_gives_torchrl_layout():
    env = ChatEnv(system_prompt=SYSTEM, input_mode="history", batch_size=(2,))
    obs = env.reset(TensorDict({"query": ["Hello", "Bye"]}, batch_size=(2,)))
    assert obs.batch_size == torch.Size([2])
    assert obs["done"].shape == (2, 1) and obs["done"].dtype == torch.bool and not obs["done"].any()
    assert obs["terminated"].shape == (2, 1) and "truncated" not in obs.keys()
    prompt = obs["history"].prompt
    assert isinstance(prompt, History) and prompt.shape == torch.Size([2, 2])
    assert list(prompt[1].content) == [SYSTEM, "Bye"] and list(prompt[0].role) == ["system", "user"]
    assert list(obs["query"]) == ["Hello", "Bye"]


def test_step_with_full_history_continues_the_conversation():
    env = ChatEnv(system_prompt=SYSTEM, input_mode="history")
    obs = env.reset(TensorDict({"query": "Hello, how are you?"}, batch_size=(1,)))
    full = obs["history"].prompt.append(
        History(role=["assistant"], content=["Fine, thanks."], batch_size=(1,)), inplace=False
    )
    stepped = env.step(obs.set("history", ChatHistory(prompt=obs["history"].prompt, full=full, batch_size=(1,))))
    nxt = stepped["next"]
    assert nxt["reward"].shape == (1, 1) and nxt["reward"].dtype == torch.float32
    assert list(nxt["history"].prompt[0].role) == ["system", "user", "assistant"]
    assert list(nxt["history"].prompt[0].content)[-1] == "Fine, thanks."


def test_step_with_a_bare_history_as_the_docs_show():
    env = ChatEnv(system_prompt=SYSTEM, input_mode="history")
    env.reset(TensorDict({"query": "Hello, how are you?"}, batch_size=(1,)))
    chat = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Hello, how are you?"},
        {"role": "assistant", "content": "I'm doing well, thank you!"},
    ]
    next_obs = env.step(TensorDict({"history": History.from_chats([chat])}, batch_size=(1,)))
    assert list(next_obs["history"].prompt[0].content) == [m["content"] for m in chat]
    assert list(next_obs["next", "history"].prompt[0].role) == ["system", "user", "assistant"]


def test_text_mode_renders_the_prompt(default_model_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_model_path)
    env = ChatEnv(system_prompt=SYSTEM, input_mode="text", tokenizer=tokenizer, batch_size=[1])
    obs = env.reset(TensorDict({"query": ["Hi"]}, batch_size=(1,)))
    assert obs["text"].prompt[0].endswith("Hi<|im_end|>\n<|im_start|>assistant\n")
    stepped = env.step(obs.set(("text", "response"), ["Hello!"]))
    assert stepped["next", "text"].prompt[0].count("Hello!") == 1


def test_tokens_mode_gives_ragged_prompt_ids(default_model_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_model_path)
    env = ChatEnv(system_prompt=SYSTEM, input_mode="tokens", tokenizer=tokenizer, batch_size=(2,))
    obs = env.reset(TensorDict({"query": ["Hi", "What is the capital of France?"]}, batch_size=(2,)))
    ids = obs.get(("tokens", "prompt"), as_list=True)
    assert [len(i) for i in ids][0] < [len(i) for i in ids][1]
    assert [tokenizer.decode(i) for i in ids] == list(obs["text"].prompt)


def test_torchrl_argument_errors():
    with pytest.raises(ValueError, match="at least one dimension"):
        ChatEnv(batch_size=())
    env = ChatEnv(system_prompt=SYSTEM, batch_size=torch.Size([1]), device="cpu")
    assert env.batch_size == 1 and env.device == torch.device("cpu")
    with pytest.raises(KeyError, match="'query'"):
        env.reset(TensorDict({"prompt": ["x"]}, batch_size=(1,)))
    env.reset(TensorDict({"query": ["x"]}, batch_size=(1,)))
    with pytest.raises(KeyError, match="no action found"):
        env.step(TensorDict({}, batch_size=(1,)))
