"""ChatEnv: input modes, multi-turn steps, transforms, done/truncated, tokens-mode bookkeeping."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from llmrl_core.data import Conversation, LLMData, Message, Response
from llmrl_core.data.history import History
from llmrl_core.data.tensor_specs import Unbounded
from llmrl_core.envs import (
    AddThinkingPrompt,
    ChatEnv,
    DataLoadingPrimer,
    DatasetChatEnv,
    GSM8KRewardParser,
    PolicyVersion,
    TemplateTransform,
    Tokenizer,
    Transform,
)
from llmrl_core.envs.tensordict_io import active_rows, end_rows, step_row_fields


def flat(t):
    """A ``(B, 1)`` entry of the env's answer (``reward``, ``done``, ...) as a list of B values."""
    return t.reshape(-1).tolist()


class Calculator(Transform):
    """A toy tool, written as TorchRL writes one: an answer containing 'CALC a+b' gets a tool message with the sum
    appended to the conversation under ("history", "prompt") of the step's "next" data."""

    def _step(self, tensordict, next_tensordict):
        conversations = next_tensordict["history"].prompt.to_conversations()
        for i, conversation in enumerate(conversations):
            text = conversation.messages[-1].text
            if "CALC " in text:
                expression = text.split("CALC ", 1)[1].split()[0].removesuffix("<|im_end|>")
                a, b = expression.split("+")
                conversation.append(Message("tool", str(int(a) + int(b))))
                self._note_row(i, tool_call=("calc", expression, str(int(a) + int(b)), False))
        next_tensordict["history"].prompt = History.from_conversations(conversations)
        return next_tensordict


class ExactMatch(Transform):
    """Reward 1 (the reward part "exact") and end the episode when the last message is the answer and equals the
    row's 'answer' field."""

    def _step(self, tensordict, next_tensordict):
        rows = step_row_fields(tensordict, next_tensordict)
        conversations = next_tensordict["history"].prompt.to_conversations()
        right = [
            c.messages[-1].role == "assistant" and c.messages[-1].text.strip() == row.get("answer")
            for c, row in zip(conversations, rows, strict=True)
        ]
        for i in (i for i, ok in enumerate(right) if ok):
            self._note_row(i, reward_components={"exact": 1.0})
        reward = next_tensordict.get("reward")
        next_tensordict.set("reward", reward + torch.tensor(right, dtype=reward.dtype).reshape(reward.shape))
        end_rows(next_tensordict, right)
        return next_tensordict

    def transform_reward_spec(self, reward_spec):
        reward_spec["reward"] = Unbounded(shape=(*reward_spec.shape, 1))
        return reward_spec


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path)


def test_reset_builds_system_and_user_messages():
    env = ChatEnv(system_prompt="Be brief.", chat_template_name="chatml")
    out = env.reset(
        ["Hi", {"query": "2+2?", "answer": "4"}, Conversation.from_chats([{"role": "user", "content": "x"}])]
    )
    history = out["history", "prompt"]
    assert [h.role for h in history] == [["system", "user"]] * 3
    assert history[1][1].content == "2+2?" and env.slots[1].data["answer"] == "4"
    assert flat(out["reward"]) == [0.0] * 3 and not out["done"].any() and active_rows(out) == [0, 1, 2]
    keys = out.keys(True)
    assert ("text", "prompt") not in keys and ("tokens", "prompt") not in keys  # history mode


def test_custom_roles_and_a_given_system_message_is_kept():
    env = ChatEnv(system_prompt="ignored", user_role="human", policy_role="bot", chat_template_name="chatml")
    chat = [{"role": "system", "content": "own"}, {"role": "human", "content": "q"}]
    out = env.reset([chat])
    history = out["history", "prompt"]
    assert history[0].role == ["system", "human"] and history[0][0].content == "own"
    out = env.step(["a<|im_end|>"])
    history = out["history", "prompt"]
    assert history[0].role == ["system", "human", "bot"] and history[0][-1].content == "a"


def test_multi_turn_step_full_conversation_becomes_the_prompt():
    env = ChatEnv(system_prompt="S", input_mode="text", chat_template_name="chatml", max_turns=3)
    env.append_transform(Calculator()).append_transform(ExactMatch())
    out = env.reset([{"query": "What is 2+3?", "answer": "5"}, {"query": "Say hi", "answer": "hi"}])
    out = env.step(["CALC 2+3<|im_end|>", Response("hi<|im_end|>", finish_reason="stop")])
    assert flat(out["done"]) == [False, True] and flat(out["terminated"]) == [False, True]
    assert flat(out["reward"]) == [0.0, 1.0] and out["reward_components"][1] == {"exact": 1.0}
    assert out["text", "prompt"][0] == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
        "<|im_start|>assistant\nCALC 2+3<|im_end|>\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"
    )
    assert out["info"][0]["num_tool_calls"] == 1 and active_rows(out) == [0]
    out = env.step(["5", None])  # a done slot takes None
    assert flat(out["done"]) == [True, True] and flat(out["reward"]) == [1.0, 0.0]
    assert out["history", "prompt"][0].role == ["system", "user", "assistant", "tool", "assistant"]
    assert out["turn"].tolist() == [2, 1]


def test_max_turns_truncates():
    env = ChatEnv(chat_template_name="chatml", max_turns=2).append_transform(ExactMatch())
    env.reset([{"query": "q", "answer": "never"}])
    out = env.step(["a"])
    assert not out["done"].any()
    out = env.step(["b"])
    assert flat(out["truncated"]) == [True] and flat(out["terminated"]) == [False] and out["done"].all()
    env2 = ChatEnv(chat_template_name="chatml")
    env2.reset(["q"])
    with pytest.raises(ValueError, match="slot 0 is not done but its action is None"):
        env2.step([None])


def test_length_cut_response_is_an_open_turn():
    env = ChatEnv(input_mode="text", chat_template_name="chatml", max_turns=2)
    env.reset(["q"])
    out = env.step([Response("half an ans", finish_reason="length")])
    msg = out["history", "prompt"][0][-1]
    assert msg.content == "half an ans" and not msg.is_complete
    assert out["text", "prompt"][0].endswith("<|im_start|>assistant\nhalf an ans")  # the policy continues the same turn


def test_step_accepts_llm_data_and_checks_sizes():
    env = ChatEnv(chat_template_name="chatml")
    env.reset(["a", "b"])
    out = env.step(LLMData(text_response=["x", "y"], finish_reasons=["stop", "stop"]))
    assert [h[-1].content for h in out["history", "prompt"]] == ["x", "y"]
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
    prompt_ids = out.get(("tokens", "prompt"), as_list=True)[0]
    assert tokenizer.decode(prompt_ids.tolist()) == env.slots[0].history.apply_chat_template(tokenizer)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    # A sampled response whose ids are NOT the canonical tokenization of its text ("CALC" split by hand):
    resp_ids = torch.tensor(
        tokenizer("CA", add_special_tokens=False)["input_ids"]
        + tokenizer("LC 2+3", add_special_tokens=False)["input_ids"]
        + [im_end]
    )
    response = Response("CALC 2+3<|im_end|>", token_ids=resp_ids, log_probs=torch.zeros(len(resp_ids)))
    out = env.step([response])
    tokens = out.get(("tokens", "prompt"), as_list=True)[0]
    assert tokens[: len(prompt_ids)].tolist() == prompt_ids.tolist()
    assert tokens[len(prompt_ids) : len(prompt_ids) + len(resp_ids)].tolist() == resp_ids.tolist()
    assert tokenizer.decode(tokens.tolist()) == env.slots[0].history.apply_chat_template(tokenizer)
    slot = env.slots[0]
    assert slot.policy_mask().sum() == len(resp_ids) and slot.all_tokens().tolist() == tokens.tolist()
    out = env.step(["5<|im_end|>"])
    assert out["done"].all() and flat(out["reward"]) == [1.0]
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
    """TorchRL's TemplateTransform: a TensorDict transform on "message" (a string is a user turn, a History the
    whole chat), whose inverse keeps the last assistant turn of the "action" text, for any template."""
    from tensordict import TensorDict

    from llmrl_core.data.history import History
    from llmrl_core.envs.transforms.td_base import Transform

    template = TemplateTransform(tokenizer)
    assert isinstance(template, Transform) and template.in_keys == ["message"] and template.in_keys_inv == ["action"]
    rendered = template(TensorDict({"message": ["hello", "bye"]}, batch_size=(2,)))["message"]
    assert list(rendered) == [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in ("hello", "bye")
    ]
    chat = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "a"},
    ]
    history = History.from_chats([chat, chat[:2]])
    assert list(template(TensorDict({"message": history}, batch_size=(2,)))["message"]) == [
        tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in (chat, chat[:2])
    ]
    for name, answer in (("chatml_format", "Sure."), ("llama3", "Two\nlines.")):
        named = TemplateTransform(tokenizer, chat_template_name=name)
        rendered_text = named(TensorDict({"message": "q"}))["message"]
        sampled = rendered_text + answer + named._assistant_markers()[1] + "\n"
        assert named.inv(TensorDict({"action": [sampled]}, batch_size=(1,)))["action"] == [answer]
    with pytest.raises(KeyError, match="message"):  # TorchRL's: its in_key missing
        template(TensorDict({"query": ["q"]}, batch_size=(1,)))
    # TorchRL's Tokenizer in a text-mode env: the reset's and each step's prompt text tokenized beside it
    from tensordict import TensorDict

    env = ChatEnv(system_prompt="S", input_mode="text", tokenizer=tokenizer, batch_size=(2,))
    env.append_transform(Tokenizer(in_keys=[("text", "prompt")], out_keys=[("ids", "prompt")], tokenizer=tokenizer))
    reset = env.reset(TensorDict({"query": ["hello", "a longer question"]}, batch_size=(2,)))
    texts = list(reset["text", "prompt"])
    padded = tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")
    assert reset["ids", "prompt"].tolist() == padded["input_ids"].tolist()
    assert reset["ids", "attention_mask"].tolist() == padded["attention_mask"].tolist()
    stepped = env.step(reset.set(("text", "response"), ["hi", "yes"]))
    following = list(stepped["next", "text", "prompt"])
    assert stepped["next", "ids", "prompt"].tolist() == tokenizer(following, padding=True)["input_ids"]


def test_policy_version_stamped_and_incremented():
    """TorchRL's PolicyVersion: "policy_version" in the reset data and in each step's "next" data (int64 per row, or
    the uuid per row), in the observation spec; on the list calls, per slot with the TensorDict transforms' entries."""
    from tensordict import TensorDict

    version = PolicyVersion()
    env = ChatEnv(chat_template_name="chatml", input_mode="text", batch_size=(2,)).append_transform(version)
    assert env.observation_spec["policy_version"].dtype == torch.int64
    reset = env.reset(TensorDict({"query": ["q", "r"]}, batch_size=(2,)))
    assert reset["policy_version"].dtype == torch.int64 and reset["policy_version"].tolist() == [0, 0]
    assert version.increment_version() == 1
    stepped = env.step(reset.set(("text", "response"), ["a", "b"]))
    assert stepped["next", "policy_version"].tolist() == [1, 1] and stepped["policy_version"].tolist() == [0, 0]
    assert [(c.old_version, c.new_version) for c in version.version_history] == [(None, 0), (0, 1)]
    env.reset(["q", "r"])
    version.increment_version()
    out = env.step(["a", "b"])
    assert [slot.next_fields["policy_version"].item() for slot in env.slots] == [2, 2]
    assert out["policy_version"].tolist() == [2, 2]
    assert env.state_dict() == {} and version.state_dict() == {"version_type": "int", "version": 2}

    uid = PolicyVersion("uuid")
    first = uid.version
    assert isinstance(first, str) and uid.increment_version() != first
    env = ChatEnv(chat_template_name="chatml", input_mode="text", batch_size=(2,)).append_transform(uid)
    reset = env.reset(TensorDict({"query": ["q", "r"]}, batch_size=(2,)))
    assert reset["policy_version"] == uid.version  # one value for the batch, as TorchRL's expanded NonTensorData
    with pytest.raises(ValueError, match="version_type"):
        PolicyVersion("float")
    with pytest.raises(TypeError, match="int policy version expected"):
        version.version = "v3"


def test_add_thinking_prompt_reopens_wrong_answers():
    """TorchRL's calling convention: ``cond`` gets each row's "next" TensorDict (here its reward); the rows it
    chooses get the prompt in place of their answer, a zero reward, and go on."""
    env = ChatEnv(chat_template_name="chatml", max_turns=4)
    env.append_transform(GSM8KRewardParser())
    chosen = []

    def wrong(td):
        chosen.append(float(td["reward"].sum()))
        return bool((td["reward"] < 1.0).all())

    env.append_transform(AddThinkingPrompt(cond=wrong, prompt="Let me re-check."))
    env.reset([{"query": "2+2?", "answer": "#### 4"}, {"query": "3+3?", "answer": "#### 6"}])
    out = env.step(["<think>2+2=5</think><answer>5</answer>", "<answer>6</answer>"])
    assert chosen == pytest.approx([0.1, 1.0])  # GSM8K's 0.1 for a wrong answer in its tag, then the right one
    assert flat(out["done"]) == [False, True]
    assert flat(out["reward"]) == [0.0, 1.0]  # zeroed for the edited turn
    assert out["history", "prompt"][0][-1].content == "<think>2+2=5</think>Let me re-check."
    assert out["history", "prompt"][1][-1].content == "<answer>6</answer>"
    with pytest.raises(ValueError, match="edit_last_turn=True needs role='assistant'"):
        AddThinkingPrompt(cond=lambda td: True, role="user")
    appended = AddThinkingPrompt(cond=lambda td: True, role="user", edit_last_turn=False)
    env2 = ChatEnv(chat_template_name="chatml", max_turns=2).append_transform(appended)
    env2.reset(["q"])
    out = env2.step(["a"])
    assert out["history", "prompt"][0].role[-1] == "user" and not out["done"].any()
    assert out["history", "prompt"][0][-1].content == appended.prompt
    out = env2.step(["b"])
    assert flat(out["done"]) == [True]  # the turn limit holds: undo_done does not reopen it


def test_add_thinking_prompt_on_torchrl_tensordict_calls():
    """The TensorDict step of a history-mode env: the chosen row's "next" history ends with the edited answer, its
    reward and done flags are cleared, the other row's are kept (TorchRL's documented behaviour)."""
    from tensordict import TensorDict

    env = ChatEnv(chat_template_name="chatml", batch_size=(2,), max_turns=4)
    env.append_transform(GSM8KRewardParser())
    env.append_transform(AddThinkingPrompt(cond=lambda td: bool((td["reward"] < 1.0).all()), prompt="Wait."))
    td = env.reset(TensorDict({"query": ["2+2?", "3+3?"], "answer": ["#### 4", "#### 6"]}, batch_size=(2,)))
    td["text_response"] = ["<answer>5</answer>", "<answer>6</answer>"]
    nxt = env.step(td)["next"]
    assert nxt["reward"].flatten().tolist() == [0.0, 1.0]
    assert nxt["done"].flatten().tolist() == [False, True]
    last = [conv.messages[-1].content for conv in nxt["history"].prompt.to_conversations()]
    assert last == ["Wait.", "<answer>6</answer>"]
    assert [slot.done for slot in env.slots] == [False, True]
    # at the turn limit the episode stays ended, and the step data says so
    env = ChatEnv(chat_template_name="chatml", batch_size=(1,), max_turns=1)
    env.append_transform(AddThinkingPrompt(cond=lambda td: True, prompt="Wait."))
    td = env.reset(TensorDict({"query": ["2+2?"]}, batch_size=(1,)))
    nxt = env.step(td.set("text_response", ["<answer>5</answer>"]))["next"]
    assert nxt["done"].flatten().tolist() == [True] and nxt["truncated"].flatten().tolist() == [True]
    assert env.slots[0].done
    # TorchRL's TensorDict call carries the conversation in history mode only: elsewhere, say so
    env = ChatEnv(chat_template_name="chatml", batch_size=(1,), input_mode="text", max_turns=3)
    env.append_transform(AddThinkingPrompt(cond=lambda td: True))
    td = env.reset(TensorDict({"query": ["2+2?"]}, batch_size=(1,)))
    with pytest.raises(RuntimeError, match="input_mode='history'"):
        env.step(td.set(("text", "response"), ["<answer>5</answer>"]))


def test_add_thinking_prompt_in_tokens_mode(default_model_path):
    """Tokens mode keeps the ids sampled: rewriting the answer is refused with the advice; a user message after it
    reopens the episode and its ids are the template's rendering of the new conversation."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_model_path)
    env = ChatEnv(tokenizer=tokenizer, input_mode="tokens", max_turns=3)
    env.append_transform(AddThinkingPrompt(cond=lambda td: True))
    env.reset(["2+2?"])
    with pytest.raises(ValueError, match="edit_last_turn=False with role='user'"):
        env.step(["<answer>5</answer><|im_end|>"])
    env = ChatEnv(tokenizer=tokenizer, input_mode="tokens", max_turns=3)
    env.append_transform(GSM8KRewardParser())
    env.append_transform(AddThinkingPrompt(cond=lambda td: True, role="user", edit_last_turn=False, prompt="Sure?"))
    env.reset([{"query": "2+2?", "answer": "#### 4"}])
    out = env.step(["<answer>5</answer><|im_end|>"])
    slot = env.slots[0]
    assert not slot.done and [m.role for m in slot.history.messages][-2:] == ["assistant", "user"]
    assert tokenizer.decode(slot.all_tokens().tolist()) == env._render(slot.history, add_generation_prompt=True)
    assert out.get(("tokens", "prompt"), as_list=True)[0].tolist() == slot.all_tokens().tolist()


def test_transform_belongs_to_one_env():
    t = Calculator()
    env = ChatEnv().append_transform(t)
    with pytest.raises(AttributeError, match="parent of transform .* already set"):  # TorchRL's error
        ChatEnv().append_transform(t)
    assert env.td_transforms == [t]


def test_close_releases_transform_resources():
    class Holder(Transform):
        closed = 0

        def close(self) -> None:
            Holder.closed += 1

    with ChatEnv() as env:
        env.append_transform(Holder()).append_transform(Holder())
    assert Holder.closed == 2


# --- partial resets, step_and_maybe_reset, set_seed, from_dataloader ----------------------------------------
class RecordResets(Transform):
    """Records which slots (and their query) each reset started, and ends an episode whose answer is 'stop'."""

    def __init__(self) -> None:
        super().__init__()
        self.resets: list[list[tuple[int, str]]] = []

    def _reset(self, tensordict, tensordict_reset):
        queries = step_row_fields(tensordict_reset, tensordict_reset)
        self.resets.append([(self._slot_of(i), queries[i]["query"]) for i in self._reset_rows(None, tensordict_reset)])
        return tensordict_reset

    def _step(self, tensordict, next_tensordict):
        answers = [c.messages[-1].text for c in next_tensordict["history"].prompt.to_conversations()]
        end_rows(next_tensordict, [a == "stop" for a in answers])
        return next_tensordict


def _rows(n):
    return [{"id": f"p{i}", "query": f"question {i}"} for i in range(n)]


def test_reset_slots_restarts_only_the_given_slots():
    rec = RecordResets()
    version = PolicyVersion()
    env = ChatEnv(chat_template_name="chatml", system_prompt="S").append_transform(rec).append_transform(version)
    env.reset(["a", "b", "c"])
    out = env.step(["x", "stop", "y"])
    kept = env.slots[0].history
    version.increment_version()
    out = env.reset_slots([1], [{"query": "d", "id": "new"}])
    assert rec.resets == [[(0, "a"), (1, "b"), (2, "c")], [(1, "d")]]  # on_reset saw the new slot only
    history = out["history", "prompt"]
    assert history[1].role == ["system", "user"] and history[1][1].content == "d"
    assert out["prompt_id"][1] == "new" and out["turn"].tolist() == [1, 0, 1] and active_rows(out) == [0, 1, 2]
    assert env.slots[0].history is kept and history[0].role == ["system", "user", "assistant"]
    out = env.step(["stop", "z", "stop"])
    assert flat(out["done"]) == [True, False, True] and out["turn"].tolist() == [2, 1, 2]
    assert flat(env.reset_slots([])["done"]) == [True, False, True]
    with pytest.raises(ValueError, match="got 1 prompts for 2 slots"):
        env.reset_slots([0, 2], ["q"])
    with pytest.raises(ValueError, match="repeated slot indices"):
        env.reset_slots([0, 0], ["q", "r"])
    with pytest.raises(IndexError, match="slot 3 out of range"):
        env.reset_slots([3], ["q"])
    with pytest.raises(RuntimeError, match="before reset"):
        ChatEnv().reset_slots([0], ["q"])
    with pytest.raises(ValueError, match="no prompts and no transform provides them"):
        env.reset_slots([0])


def test_reset_slots_draws_from_the_primer_without_skipping_rows():
    primer = DataLoadingPrimer(_rows(10), batch_size=1, repeats=2, group_repeats=True, shuffle=False)
    env = ChatEnv(batch_size=2, chat_template_name="chatml").append_transform(primer)
    out = env.reset_batch()
    assert list(zip(out["prompt_id"], out["group_id"], out["sample_index"].tolist(), strict=True)) == [
        ("p0", 0, 0),
        ("p0", 0, 1),
    ]
    out = env.reset_slots([1])  # the primer serves a whole group; slot 1 takes its first copy
    assert (out["prompt_id"][1], out["group_id"][1], out["sample_index"][1].item()) == ("p1", 1, 0)
    assert (out["prompt_id"][0], out["group_id"][0]) == ("p0", 0)
    state = env.state_dict()
    assert state["pending_prompts"] == [
        {"data": {"id": "p1", "query": "question 1"}, "prompt_id": "p1", "group_id": 1, "sample_index": 1}
    ]
    out = env.reset_slots([0])  # the other copy, not a new row
    assert (out["prompt_id"][0], out["group_id"][0], out["sample_index"][0].item()) == ("p1", 1, 1)
    assert "pending_prompts" not in env.state_dict()
    # a checkpoint taken mid-group resumes with the copy that was still owed, then the next group
    fresh = ChatEnv(batch_size=2, chat_template_name="chatml").append_transform(
        DataLoadingPrimer(_rows(10), batch_size=1, repeats=2, group_repeats=True, shuffle=False)
    )
    fresh.load_state_dict(state)
    out = fresh.reset_batch()
    assert list(zip(out["prompt_id"], out["group_id"], out["sample_index"].tolist(), strict=True)) == [
        ("p1", 1, 1),
        ("p2", 2, 0),
    ]


def test_reset_slots_in_tokens_mode_tokenizes_the_new_prompt(tokenizer):
    env = ChatEnv(tokenizer=tokenizer, input_mode="tokens", max_turns=3, chat_template_name="tokenizer")
    env.reset(["first", "second"])
    out = env.step(["one<|im_end|>", "two<|im_end|>"])
    before = out.get(("tokens", "prompt"), as_list=True)[0].tolist()
    out = env.reset_slots([1], ["third"])
    tokens = out.get(("tokens", "prompt"), as_list=True)
    assert tokens[0].tolist() == before
    assert tokenizer.decode(tokens[1].tolist()) == env.slots[1].history.apply_chat_template(tokenizer)
    assert not env.slots[1].policy_mask().any()


def test_step_and_maybe_reset_returns_the_step_and_the_next_prompts():
    primer = DataLoadingPrimer(_rows(10), batch_size=2, shuffle=False)
    env = ChatEnv(batch_size=2, chat_template_name="chatml").append_transform(RecordResets()).append_transform(primer)
    out = env.reset_batch()
    step_out, next_out = env.step_and_maybe_reset(["go on", "go on"])
    assert step_out is next_out and active_rows(next_out) == [0, 1]  # nothing finished: nothing reset
    step_out, next_out = env.step_and_maybe_reset(["stop", "go on"])
    assert flat(step_out["done"]) == [True, False]
    finished = step_out["history", "prompt"][0]
    assert [m.content for m in finished] == ["question 0", "go on", "stop"]  # the finished episode
    assert flat(next_out["done"]) == [False, False] and next_out["turn"].tolist() == [0, 2]
    assert next_out["prompt_id"] == ["p2", "p1"]
    assert [m.content for m in next_out["history", "prompt"][0]] == ["question 2"]
    step_out, next_out = env.step_and_maybe_reset(["stop", "stop"], prompts=["x", "y"])
    assert [h[0].content for h in next_out["history", "prompt"]] == ["x", "y"] and step_out["done"].all()
    assert out["prompt_id"] == ["p0", "p1"]


def test_set_seed_restarts_the_prompt_order():
    env = DatasetChatEnv(_rows(20), batch_size=2, seed=0)

    def draw(n):
        return [pid for _ in range(n) for pid in env.reset_batch()["prompt_id"]]

    assert env.set_seed(7) == 7
    first = draw(4)
    env.reset_slots([0])  # leaves a drawn row pending: set_seed drops it
    assert env.set_seed(7) == 7
    assert draw(4) == first and len(set(first)) == 8
    env.set_seed(8)
    assert draw(4) != first
    seed = env.set_seed()
    assert isinstance(seed, int) and env.primer.seed == seed


def test_from_dataloader_builds_a_primed_env(tmp_path):
    import json

    from torch.utils.data import DataLoader

    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": i, "question": f"q{i}"}) + "\n" for i in range(5)))
    env = ChatEnv.from_dataloader(
        str(path),
        batch_size=2,
        repeats=2,
        group_repeats=True,
        shuffle=False,
        rename={"question": "query"},
        system_prompt="S",
        max_turns=2,
    )
    assert isinstance(env, DatasetChatEnv) and env.batch_size == (4,) and env.max_turns == 2
    assert env.td_transforms == [env.primer]
    out = env.reset_batch()
    assert out["prompt_id"] == [0, 0, 1, 1] and out["group_id"] == [0, 0, 1, 1]
    assert out["sample_index"].tolist() == [0, 1, 0, 1]
    assert [m.content for m in out["history", "prompt"][2]] == ["S", "q1"]
    out = env.step(["a"] * 4)
    assert not out["done"].any()
    assert env.step(["b"] * 4)["truncated"].all()

    loader = DataLoader([{"query": f"row {i}"} for i in range(6)], batch_size=3, shuffle=False)
    env = ChatEnv.from_dataloader(loader, chat_template_name="chatml")
    assert env.batch_size == (3,) and env.primer.shuffle is False
    assert [h[0].content for h in env.reset_batch()["history", "prompt"]] == ["row 0", "row 1", "row 2"]
    ungrouped = ChatEnv.from_dataloader(_rows(4), batch_size=3, repeats=2, group_repeats=False)
    assert ungrouped.batch_size == (3,) and ungrouped.reset_batch()["sample_index"].tolist() == [0, 1, 0]


def test_a_transform_that_raises_is_named_as_the_users_code():
    """On the list calls (the flows', the collector's) a transform's error is the user's code failing, said in one
    line naming the transform and the hook; on TorchRL's TensorDict calls it keeps its type (TorchRL's), with a
    note naming them. The user's code already said as such (a reward function's) passes as it is."""
    from llmrl_core.envs.reward_calls import RewardFunctionError
    from llmrl_core.envs.td_list_calls import EnvTransformError
    from llmrl_core.user_code import UserCodeError

    class Broken(Transform):
        def _step(self, tensordict, next_tensordict):
            raise KeyError("answer_field")

    class Failing(Transform):
        def _step(self, tensordict, next_tensordict):
            raise RewardFunctionError("env.rewards[0].function 'm:f' raised")

    env = ChatEnv(batch_size=1).append_transform(Broken())
    env.reset([{"query": "2+2?"}])
    with pytest.raises(EnvTransformError, match=r"^env transform Broken._step raised KeyError: 'answer_field'$") as err:
        env.step(["4"])
    assert isinstance(err.value, UserCodeError) and isinstance(err.value.__cause__, KeyError)
    td = env.reset(TensorDict({"query": ["2+2?"]}, [1]))
    with pytest.raises(KeyError, match="answer_field") as err:
        env.step(td.set("text_response", ["4"]))
    assert err.value.__notes__ == ["(raised in env transform Broken._step)"]
    env = ChatEnv(batch_size=1).append_transform(Failing())
    env.reset([{"query": "2+2?"}])
    with pytest.raises(RewardFunctionError, match="env.rewards") as err:  # already the user's code: as it is
        env.step(["4"])
    assert not getattr(err.value, "__notes__", None)
