"""TorchRL's History tensorclass: shape, indexing, rendering, masks and growth, against TorchRL 0.14.1's output."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from llmrl_core.data import Conversation, History
from llmrl_core.modules.policies import ChatHistory
from tests.test_conversation import CHAT, TORCHRL_ASSISTANT_MASK, TORCHRL_CHATML_TEXT, TORCHRL_INPUT_IDS


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path)


def test_from_chats_shape_and_indexing():
    history = History.from_chats([CHAT, CHAT[:3]])
    assert history.batch_dims == 2 and history.batch_size[0] == 2
    assert history[0].shape == torch.Size([5]) and history[1].shape == torch.Size([3])
    assert list(history[1].role) == ["system", "user", "assistant"]
    same = History.from_chats([CHAT[:3], CHAT[:3]])
    assert same.shape == torch.Size([2, 3])
    assert list(same[:, -1].content) == ["Let me use a tool.", "Let me use a tool."]
    assert list(same[0].role) == ["system", "user", "assistant"]


def test_lives_in_a_tensordict_under_chat_history():
    history = History.from_chats([CHAT[:2], CHAT[:2]])
    td = TensorDict(history=ChatHistory(full=history), batch_size=(2,))
    assert td.get(("history", "full")).shape == torch.Size([2, 2])
    assert list(td["history"].full[1].content) == ["You are a calculator.", "What is 2+3?"]


def test_apply_chat_template_matches_torchrl(tokenizer):
    history = History.from_chats([CHAT])
    assert history.apply_chat_template(tokenizer=tokenizer, add_generation_prompt=False) == [TORCHRL_CHATML_TEXT]
    out = history.apply_chat_template(
        tokenizer=tokenizer, add_generation_prompt=False, return_assistant_tokens_mask=True
    )
    assert out.batch_size == torch.Size([1])
    assert out[0]["input_ids"].tolist() == TORCHRL_INPUT_IDS
    assert out[0]["assistant_masks"].tolist() == TORCHRL_ASSISTANT_MASK
    assert out[0]["attention_mask"].dtype == torch.int64 and out[0]["attention_mask"].all()
    ids = history[0].apply_chat_template(tokenizer=tokenizer, add_generation_prompt=False, tokenize=True)
    assert ids.shape == (1, len(TORCHRL_INPUT_IDS))
    prompt = history[0][:2].apply_chat_template(tokenizer=tokenizer, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")


def test_append_and_extend_grow_the_right_dimension():
    history = History.from_chats([CHAT[:2], CHAT[:2]])
    history.append(History(role=["assistant", "assistant"], content=["4", "5"], batch_size=(2,)))
    assert history.shape == torch.Size([2, 3]) and list(history[:, -1].content) == ["4", "5"]
    more = History.from_chats([CHAT[:3]])
    grown = history.extend(more, inplace=False)
    assert grown.shape == torch.Size([3, 3]) and history.shape == torch.Size([2, 3])
    with pytest.raises(RuntimeError, match="one less dimension"):
        history.append(more)


def test_extending_chats_of_different_lengths_along_the_messages_grows_each():
    """A tool transform's ``history.extend(results, dim=-1)`` on chats of 2 and 1 messages (a ragged lazy stack)."""
    history = History.from_chats([CHAT[:2], CHAT[:1]])
    results = History(role=[["tool"], ["tool"]], content=[["a"], ["b"]], batch_size=(2, 1))
    assert history.extend(results, dim=-1) is history
    assert list(history[0].content) == [CHAT[0]["content"], CHAT[1]["content"], "a"]
    assert list(history[1].content) == [CHAT[0]["content"], "b"]
    copy = history.extend(results, inplace=False, dim=-1)
    assert [len(c.messages) for c in copy.to_conversations()] == [4, 3]
    assert [len(c.messages) for c in history.to_conversations()] == [3, 2]


def test_growing_a_chat_taken_from_a_batch_in_place_grows_it_in_the_batch():
    """TorchRL 0.14.1: ``h[i].append(msg)`` (in place by default) grows the ``i``-th chat of ``h``, and so does
    ``extend``; ``inplace=False`` leaves both alone (probe run in TorchRL's venv: the first chat went from 2 to 3
    messages, the second stayed at 1)."""
    history = History.from_chats([CHAT[:2], CHAT[:1]])
    reply = History(role="assistant", content="5")
    first = history[0]
    assert first.append(reply) is first
    assert list(history[0].content) == [CHAT[0]["content"], CHAT[1]["content"], "5"]
    assert list(history[1].content) == [CHAT[0]["content"]]
    history[1].extend(History(role=["user", "assistant"], content=["again", "6"], batch_size=(2,)))
    assert list(history[1].role) == ["system", "user", "assistant"] and history[1][-1].content == "6"
    copy = history[0].append(reply, inplace=False)
    assert copy.shape == torch.Size([4]) and history[0].shape == torch.Size([3])
    rendered = history.apply_chat_template(
        tokenizer=None, chat_template_name="chatml_format", add_generation_prompt=False
    )
    assert rendered[0].endswith("<|im_start|>assistant\n5<|im_end|>\n") and "again" in rendered[1]


def test_round_trip_with_internal_conversations():
    history = History.from_chats([CHAT, CHAT[:2]])
    convs = history.to_conversations()
    assert [len(c) for c in convs] == [5, 2]
    assert (convs[0][3].role, convs[0][3].content) == ("tool", "5")
    back = History.from_conversations([Conversation.from_chats(CHAT[:2])])
    assert list(back[0].role) == ["system", "user"]
