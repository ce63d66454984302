"""TorchRL's ``env.rollout(max_steps, policy)`` on ChatEnv: the (B, T) stack, the stop rules, ``actions``,
``set_truncated`` and TorchRL's argument errors."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from llmrl_core.envs import ChatEnv, Transform
from llmrl_core.envs.dataset_chat_env import DatasetChatEnv
from llmrl_core.envs.tensordict_io import end_rows, step_row_fields

QUERIES = ["What is 2+3?", "Name a colour."]


def _queries() -> TensorDict:
    return TensorDict({"query": QUERIES, "answer": ["5", "red"]}, batch_size=(2,))


def _numbered_answers(td: TensorDict) -> TensorDict:
    """A scripted TensorDict policy: answer ``"<turn> of <query>"`` from the conversation it is given."""
    answers = []
    for history in td["history"].prompt.unbind(0):
        messages = history.to_messages()
        turn = sum(m.role == "assistant" for m in messages)
        query = next(m.text for m in messages if m.role == "user")
        answers.append(f"{turn} of {query}")
    return td.set("text_response", answers)


class EndAfter(Transform):
    """Ends a conversation once it holds as many answers as its row's ``turns`` field says."""

    def _step(self, tensordict, next_tensordict):
        rows = step_row_fields(tensordict, next_tensordict)
        chats = next_tensordict["history"].prompt.to_conversations()
        answers = [sum(m.role == "assistant" for m in chat.messages) for chat in chats]
        end_rows(next_tensordict, [n >= int(row["turns"]) for n, row in zip(answers, rows, strict=True)])
        return next_tensordict


def test_rollout_stacks_the_turns_and_carries_the_next_prompt():
    env = ChatEnv(batch_size=(2,), chat_template_name="chatml", system_prompt="Be brief.")
    r = env.rollout(3, _numbered_answers, tensordict=_queries())
    assert r.batch_size == torch.Size([2, 3])
    assert r["next", "done"].shape == (2, 3, 1) and r["done"].shape == (2, 3, 1)
    assert {"history", "query", "answer", "done", "terminated", "next"} <= set(r.keys())
    for t in range(3):
        step = r[1, t]
        assert step["query"] == QUERIES[1] and step["answer"] == "red"  # the row's fields are carried
        prompt = [m.text for m in step["history"].prompt.to_messages()]
        following = [m.text for m in step["next", "history"].prompt.to_messages()]
        assert prompt == ["Be brief.", QUERIES[1]] + [f"{k} of {QUERIES[1]}" for k in range(t)]
        assert following == prompt + [f"{t} of {QUERIES[1]}"]


def test_rollout_stops_when_any_or_all_conversations_are_done():
    def env():
        return ChatEnv(batch_size=(2,), chat_template_name="chatml").append_transform(EndAfter())

    reset = TensorDict({"query": QUERIES, "turns": ["1", "3"]}, batch_size=(2,))
    assert env().rollout(5, _numbered_answers, tensordict=reset.clone()).batch_size == (2, 1)
    r = env().rollout(5, _numbered_answers, tensordict=reset.clone(), break_when_all_done=True)
    assert r.batch_size == (2, 3)
    assert r["next", "done"][:, :, 0].tolist() == [[True, True, True], [False, False, True]]
    # the finished conversation is not stepped again: its history stays at its one answer
    assert len(r[0, 2]["next", "history"].prompt.to_messages()) == 2
    r = env().rollout(5, _numbered_answers, tensordict=reset.clone(), break_when_any_done=False)
    assert r.batch_size == (2, 5)  # neither rule: max_steps turns


def test_rollout_with_actions_a_primer_and_set_truncated():
    rows = [{"query": q} for q in QUERIES]
    env = DatasetChatEnv.from_dataloader(rows, batch_size=2, shuffle=False, chat_template_name="chatml")
    r = env.rollout(5, actions=[["a", "b"], ["c", "d"]], set_truncated=True)  # the primer gives the prompts
    assert r.batch_size == (2, 2)
    assert [m.text for m in r[0, 1]["next", "history"].prompt.to_messages()][-3:] == [QUERIES[0], "a", "c"]
    assert r["next", "truncated"][:, :, 0].tolist() == [[False, True], [False, True]]
    assert r["next", "done"][:, -1].all()


def test_rollout_argument_errors_are_torchrls():
    env = ChatEnv(batch_size=(2,), chat_template_name="chatml")
    with pytest.raises(ValueError, match="needs a policy"):
        env.rollout(2, tensordict=_queries())
    with pytest.raises(ValueError, match="Cannot pass both `policy` and `actions`"):
        env.rollout(2, _numbered_answers, actions=[["a", "b"]], tensordict=_queries())
    with pytest.raises(TypeError, match="Cannot have both break_when_all_done and break_when_any_done"):
        env.rollout(2, _numbered_answers, break_when_all_done=True, break_when_any_done=True)
    with pytest.raises(RuntimeError, match="tensordict must be provided when auto_reset is False"):
        env.rollout(2, _numbered_answers, auto_reset=False)
    with pytest.raises(RuntimeError, match="no prompts"):  # TorchRL: "ChatEnv expects a tensordict as input"
        env.rollout(2, _numbered_answers)


def test_rollout_with_a_transformers_wrapper_has_torchrls_layout(hf_model_fp32):
    """TorchRL 0.14.1's own ``ChatEnv.rollout(3, TransformersWrapper(...history...))`` on the packaged model, run
    in the side venv, leaves these root keys, and under "next" the done flags and the history (no reward, no
    truncated: the bare env has no reward source and no turn limit)."""
    from llmrl_core.modules import TransformersWrapper

    model, tokenizer = hf_model_fp32
    env = ChatEnv(batch_size=(2,), tokenizer=tokenizer, system_prompt="Be brief.")
    policy = TransformersWrapper(
        model,
        tokenizer=tokenizer,
        input_mode="history",
        generate=True,
        generate_kwargs={"max_new_tokens": 4, "do_sample": False},
    )
    r = env.rollout(2, policy, tensordict=TensorDict({"query": QUERIES}, batch_size=(2,)))
    assert r.batch_size == (2, 2)
    torchrl_root = ["done", "history", "log_probs", "masks", "next", "query", "terminated", "text", "tokens"]
    assert sorted(r.keys()) == torchrl_root
    assert sorted(r["next"].keys()) == ["done", "history", "terminated"]
    first = r[0, 0]["history"].full.to_messages()[-1].text
    second_prompt = [m.text for m in r[0, 1]["history"].prompt.to_messages()]
    assert first and second_prompt[-1] == first  # the sampled answer is the next turn's context
