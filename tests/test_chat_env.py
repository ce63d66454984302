"""ChatEnv: input modes, multi-turn steps, transforms, done/truncated, tokens-mode bookkeeping."""

from __future__ import annotations

import pytest
import torch

from llmrl_core.data import History, LLMData, Response
from llmrl_core.envs import (
    AddThinkingPrompt,
    ChatEnv,
    GSM8KRewardParser,
    PolicyVersion,
    TemplateTransform,
    Tokenizer,
    Transform,
)


class Calculator(Transform):
    """A toy tool: a response containing 'CALC a+b' gets a tool message with the sum."""

    def step_slot(self, slot):
        text = slot.history[-1].text
        if "CALC " in text:
            a, b = text.split("CALC ", 1)[1].split()[0].split("+")
            slot.add_message("tool", str(int(a) + int(b)))
            slot.info["num_tool_calls"] = slot.info.get("num_tool_calls", 0) + 1


class ExactMatch(Transform):
    """Reward 1 and terminate when the response equals the row's 'answer'."""

    def step_slot(self, slot):
        if slot.history[-1].role == "assistant" and slot.history[-1].text.strip() == slot.data.get("answer"):
            slot.add_reward(1.0, name="exact")
            slot.terminate()


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path)


def test_reset_builds_system_and_user_messages():
    env = ChatEnv(system_prompt="Be brief.", chat_template_name="chatml")
    out = env.reset(["Hi", {"query": "2+2?", "answer": "4"}, History.from_chats([{"role": "user", "content": "x"}])])
    assert [h.role for h in out.history] == [["system", "user"]] * 3
    assert out.history[1][1].content == "2+2?" and out.data[1]["answer"] == "4"
    assert out.reward.tolist() == [0.0] * 3 and not out.done.any() and out.active == [0, 1, 2]
    assert out.text is None and out.tokens is None  # history mode


def test_custom_roles_and_a_given_system_message_is_kept():
    env = ChatEnv(system_prompt="ignored", user_role="human", policy_role="bot", chat_template_name="chatml")
    chat = [{"role": "system", "content": "own"}, {"role": "human", "content": "q"}]
    out = env.reset([chat])
    assert out.history[0].role == ["system", "human"] and out.history[0][0].content == "own"
    out = env.step(["a<|im_end|>"])
    assert out.history[0].role == ["system", "human", "bot"] and out.history[0][-1].content == "a"


def test_multi_turn_step_full_conversation_becomes_the_prompt():
    env = ChatEnv(system_prompt="S", input_mode="text", chat_template_name="chatml", max_turns=3)
    env.append_transform(Calculator()).append_transform(ExactMatch())
    out = env.reset([{"query": "What is 2+3?", "answer": "5"}, {"query": "Say hi", "answer": "hi"}])
    out = env.step(["CALC 2+3<|im_end|>", Response("hi<|im_end|>", finish_reason="stop")])
    assert out.done.tolist() == [False, True] and out.terminated.tolist() == [False, True]
    assert out.reward.tolist() == [0.0, 1.0] and out.reward_components[1] == {"exact": 1.0}
    assert out.text[0] == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
        "<|im_start|>assistant\nCALC 2+3<|im_end|>\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"
    )
    assert out.info[0]["num_tool_calls"] == 1 and out.active == [0]
    out = env.step(["5", None])  # a done slot takes None
    assert out.done.tolist() == [True, True] and out.reward.tolist() == [1.0, 0.0]
    assert out.history[0].role == ["system", "user", "assistant", "tool", "assistant"]
    assert out.turn.tolist() == [2, 1]


def test_max_turns_truncates():
    env = ChatEnv(chat_template_name="chatml", max_turns=2).append_transform(ExactMatch())
    env.reset([{"query": "q", "answer": "never"}])
    out = env.step(["a"])
    assert not out.done.any()
    out = env.step(["b"])
    assert out.truncated.tolist() == [True] and out.terminated.tolist() == [False] and out.done.all()
    env2 = ChatEnv(chat_template_name="chatml")
    env2.reset(["q"])
    with pytest.raises(ValueError, match="slot 0 is not done but its action is None"):
        env2.step([None])


def test_length_cut_response_is_an_open_turn():
    env = ChatEnv(input_mode="text", chat_template_name="chatml", max_turns=2)
    env.reset(["q"])
    out = env.step([Response("half an ans", finish_reason="length")])
    msg = out.history[0][-1]
    assert msg.content == "half an ans" and not msg.is_complete
    assert out.text[0].endswith("<|im_start|>assistant\nhalf an ans")  # the policy continues the same turn


def test_step_accepts_llm_data_and_checks_sizes():
    env = ChatEnv(chat_template_name="chatml")
    env.reset(["a", "b"])
    out = env.step(LLMData(text_response=["x", "y"], finish_reasons=["stop", "stop"]))
    assert [h[-1].content for h in out.history] == ["x", "y"]
    with pytest.raises(ValueError, match="step\\(\\) got 1 actions for 2 slots"):
        env.step(["x"])
    with pytest.raises(ValueError, match="no 'query' field"):
        env.reset([{"question": "q"}])
    with pytest.raises(ValueError, match="no prompts and no transform provides them"):
        ChatEnv().reset()


def test_tokens_mode_keeps_sampled_ids_and_marks_policy_tokens(tokenizer):
    env = ChatEnv(tokenizer=tokenizer, input_mode="tokens", system_prompt="S", max_turns=3)
    env.append_transform(Calculator()).append_transform(ExactMatch())
    out = env.reset([{"query": "What is 2+3?", "answer": "5"}])
    prompt_ids = out.tokens[0]
    assert tokenizer.decode(prompt_ids.tolist()) == out.history[0].apply_chat_template(tokenizer)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    # A sampled response whose ids are NOT the canonical tokenization of its text ("CALC" split by hand):
    resp_ids = torch.tensor(
        tokenizer("CA", add_special_tokens=False)["input_ids"]
        + tokenizer("LC 2+3", add_special_tokens=False)["input_ids"]
        + [im_end]
    )
    response = Response("CALC 2+3<|im_end|>", token_ids=resp_ids, log_probs=torch.zeros(len(resp_ids)))
    out = env.step([response])
    tokens = out.tokens[0]
    assert tokens[: len(prompt_ids)].tolist() == prompt_ids.tolist()
    assert tokens[len(prompt_ids) : len(prompt_ids) + len(resp_ids)].tolist() == resp_ids.tolist()
    assert tokenizer.decode(tokens.tolist()) == out.history[0].apply_chat_template(tokenizer)
    slot = env.slots[0]
    assert slot.policy_mask().sum() == len(resp_ids) and slot.all_tokens().tolist() == tokens.tolist()
    out = env.step(["5<|im_end|>"])
    assert out.done.all() and out.reward.tolist() == [1.0]
    assert tokenizer.decode(tokens_of(env).tolist()).endswith(
        "<|im_start|>assistant\n5<|im_end|>"
    )  # no glue at the end
    mask = env.slots[0].policy_mask()
    assert tokenizer.decode(tokens_of(env)[mask].tolist()) == "CALC 2+3<|im_end|>5<|im_end|>"
    # tool output and template glue are not policy tokens
    assert "<|im_start|>tool\n5<|im_end|>" in tokenizer.decode(tokens_of(env)[~mask].tolist())


def tokens_of(env):
    return env.slots[0].all_tokens()


def test_tokens_mode_requires_a_tokenizer():
    with pytest.raises(ValueError, match="needs a tokenizer"):
        ChatEnv(input_mode="tokens")


def test_template_and_tokenizer_transforms(tokenizer):
    env = ChatEnv(system_prompt="S")
    env.append_transform(TemplateTransform(tokenizer)).append_transform(Tokenizer(tokenizer))
    out = env.reset(["hello"])
    assert out.text[0] == tokenizer.apply_chat_template(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "hello"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert out.tokens[0].tolist() == tokenizer(out.text[0], add_special_tokens=False)["input_ids"]


def test_policy_version_stamped_and_incremented():
    version = PolicyVersion()
    env = ChatEnv(chat_template_name="chatml").append_transform(version)
    assert env.reset(["q"]).policy_version == 0
    version.increment_version()
    out = env.step(["a"])
    assert out.policy_version == 1 and out.info[0]["policy_version"] == 1
    uid = PolicyVersion("uuid")
    first = uid.version
    assert isinstance(first, str) and uid.increment_version() != first
    with pytest.raises(ValueError, match="version_type"):
        PolicyVersion("float")
    assert env.state_dict() == {"transforms": [{"version_type": "int", "version": 1}]}


def test_add_thinking_prompt_reopens_wrong_answers():
    env = ChatEnv(chat_template_name="chatml", max_turns=4)
    env.append_transform(GSM8KRewardParser())
    env.append_transform(AddThinkingPrompt(cond=lambda slot: slot.reward < 1.0, prompt="Let me re-check."))
    env.reset([{"query": "2+2?", "answer": "#### 4"}, {"query": "3+3?", "answer": "#### 6"}])
    out = env.step(["<think>2+2=5</think><answer>5</answer>", "<answer>6</answer>"])
    assert out.done.tolist() == [False, True]
    assert out.reward.tolist() == [0.0, 1.0]  # zeroed for the edited turn
    assert out.history[0][-1].content == "<think>2+2=5</think>Let me re-check."
    assert out.info[0]["thinking_prompt_added"] and "thinking_prompt_added" not in out.info[1]
    with pytest.raises(ValueError, match="edit_last_turn=True needs role='assistant'"):
        AddThinkingPrompt(cond=lambda s: True, role="user")
    appended = AddThinkingPrompt(cond=lambda s: True, role="user", edit_last_turn=False)
    env2 = ChatEnv(chat_template_name="chatml", max_turns=2).append_transform(appended)
    env2.reset(["q"])
    out = env2.step(["a"])
    assert out.history[0].role[-1] == "user" and not out.done.any()


def test_transform_belongs_to_one_env():
    t = Calculator()
    ChatEnv().append_transform(t)
    with pytest.raises(ValueError, match="already attached"):
        ChatEnv().append_transform(t)


def test_close_releases_transform_resources():
    from llmrl_core.envs import ChatEnv, Transform

    class Holder(Transform):
        closed = 0

        def close(self) -> None:
            Holder.closed += 1

    with ChatEnv() as env:
        env.append_transform(Holder()).append_transform(Holder())
    assert Holder.closed == 2
