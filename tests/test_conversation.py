"""Conversation: building, chat templates (packaged model's tokenizer and ChatML), assistant masks, from_text."""

from __future__ import annotations

import pytest
import torch

from llmrl_core.data import ContentBase, Conversation, ConversationBatch, Message, as_nested_tensor, as_padded_tensor

CHAT = [
    {"role": "system", "content": "You are a calculator."},
    {"role": "user", "content": "What is 2+3?"},
    {"role": "assistant", "content": "Let me use a tool."},
    {"role": "tool", "content": "5"},
    {"role": "assistant", "content": "The answer is 5."},
]

# Expected values from TorchRL 0.14.1: History.from_chats([CHAT]).apply_chat_template(tokenizer=<SmolLM2
# tokenizer>, chat_template_name="chatml_format", add_generation_prompt=False, return_assistant_tokens_mask=True).
TORCHRL_CHATML_TEXT = (
    "<|im_start|>system\nYou are a calculator.<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
    "<|im_start|>assistant\nLet me use a tool.<|im_end|>\n<|im_start|>tool\n5<|im_end|>\n"
    "<|im_start|>assistant\nThe answer is 5.<|im_end|>\n"
)
TORCHRL_INPUT_IDS = [
    1, 9690, 198, 2683, 359, 253, 17993, 30, 2, 198, 1, 4093, 198, 1780, 314, 216, 34, 27, 35, 47, 2, 198, 1, 520,
    9531, 198, 4239, 549, 722, 253, 1763, 30, 2, 198, 1, 19324, 198, 37, 2, 198, 1, 520, 9531, 198, 504, 2988, 314,
    216, 37, 30, 2, 198,
]  # fmt: skip
TORCHRL_ASSISTANT_MASK = [0] * 26 + [1] * 6 + [0] * 12 + [1] * 6 + [0] * 2


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path)


def test_build_append_and_index():
    h = Conversation.from_chats(CHAT[:2])
    assert isinstance(h, Conversation) and h.role == ["system", "user"]
    h.append({"role": "assistant", "content": "5"}).append(Message("user", "thanks"))
    assert len(h) == 4 and h[-1].content == "thanks"
    assert h[1:3].role == ["user", "assistant"]
    copy = h.copy()
    copy[0].content = "changed"
    assert h[0].content == "You are a calculator."


def test_from_chats_of_chats_is_a_ragged_batch():
    batch = Conversation.from_chats([CHAT, CHAT[:2], CHAT[:3]])
    assert isinstance(batch, ConversationBatch)
    assert [len(h) for h in batch] == [5, 2, 3]
    batch.append([None, {"role": "assistant", "content": "ok"}, None])
    assert [len(h) for h in batch] == [5, 3, 3]


def test_bad_messages_name_the_problem():
    with pytest.raises(ValueError, match=r"message 1: missing field\(s\) \['content'\]"):
        Conversation([{"role": "user", "content": "a"}, {"role": "assistant"}])
    with pytest.raises(ValueError, match="unknown field"):
        Conversation([{"role": "user", "content": "a", "contents": "b"}])
    with pytest.raises(ValueError, match="unknown chat_template_name 'nope'"):
        Conversation.from_chats(CHAT).apply_chat_template(chat_template_name="nope")


def test_chatml_rendering_matches_torchrl():
    h = Conversation.from_chats(CHAT)
    assert h.apply_chat_template(chat_template_name="chatml_format", add_generation_prompt=False) == TORCHRL_CHATML_TEXT
    with_prompt = h.apply_chat_template(chat_template_name="chatml", add_generation_prompt=True)
    assert with_prompt == TORCHRL_CHATML_TEXT + "<|im_start|>assistant\n"


def test_chatml_tokens_and_masks_match_torchrl(tokenizer):
    h = Conversation.from_chats(CHAT)
    out = h.apply_chat_template(
        tokenizer,
        chat_template_name="chatml",
        add_generation_prompt=False,
        return_assistant_tokens_mask=True,
        include_end_of_turn=False,
    )
    assert out.input_ids.tolist() == TORCHRL_INPUT_IDS
    assert out.assistant_masks.long().tolist() == TORCHRL_ASSISTANT_MASK


def test_default_mask_also_covers_the_sampled_end_of_turn_token(tokenizer):
    out = Conversation.from_chats(CHAT).apply_chat_template(
        tokenizer, chat_template_name="chatml", add_generation_prompt=False, return_assistant_tokens_mask=True
    )
    expected = list(TORCHRL_ASSISTANT_MASK)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    expected[32] = expected[50] = 1  # the <|im_end|> right after each assistant content
    assert out.input_ids[32] == out.input_ids[50] == im_end
    assert out.assistant_masks.long().tolist() == expected


def test_tokenizer_own_template_is_used_and_masks_skip_tool_tokens(tokenizer):
    chat = CHAT[1:]  # no system message: SmolLM2's own template inserts its default one
    h = Conversation.from_chats(chat)
    text = h.apply_chat_template(tokenizer, add_generation_prompt=True)
    assert text == tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    out = h.apply_chat_template(tokenizer, add_generation_prompt=False, return_assistant_tokens_mask=True)
    ids, mask = out.input_ids, out.assistant_masks
    assert ids.tolist() == tokenizer(out.text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids[mask].tolist()) == "Let me use a tool.<|im_end|>The answer is 5.<|im_end|>"
    tool_ids = tokenizer("<|im_start|>tool\n5<|im_end|>", add_special_tokens=False)["input_ids"]
    start = next(i for i in range(len(ids)) if ids[i : i + len(tool_ids)].tolist() == tool_ids)
    assert not mask[start : start + len(tool_ids)].any()


def test_incomplete_last_message_is_rendered_open(tokenizer):
    h = Conversation.from_chats(CHAT[:2] + [{"role": "assistant", "content": "Partial ans", "is_complete": False}])
    text = h.apply_chat_template(tokenizer, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\nPartial ans")
    out = h.apply_chat_template(tokenizer, return_assistant_tokens_mask=True)
    assert tokenizer.decode(out.input_ids[out.assistant_masks].tolist()) == "Partial ans"


def test_from_text_matches_torchrl():
    # Expected values from TorchRL 0.14.1: Conversation.from_text(text, chat_template_name="chatml_format").
    full = Conversation.from_text(TORCHRL_CHATML_TEXT, chat_template_name="chatml_format")
    assert full.role == ["system", "user", "assistant", "tool", "assistant"]
    assert full.content == ["You are a calculator.", "What is 2+3?", "Let me use a tool.", "5", "The answer is 5."]
    assert [m.is_complete for m in full] == [True] * 5
    partial = Conversation.from_text(
        TORCHRL_CHATML_TEXT + "<|im_start|>assistant\nI think the ans", chat_template_name="chatml"
    )
    assert partial.role[-1] == "assistant" and partial.content[-1] == "I think the ans"
    assert [m.is_complete for m in partial] == [True] * 5 + [False]


def test_from_text_detects_format_and_handles_bare_responses(tokenizer):
    assert Conversation.from_text(TORCHRL_CHATML_TEXT).role[-1] == "assistant"  # detected from markers
    done = Conversation.from_text("It is 5.<|im_end|>", tokenizer=tokenizer)
    assert done.to_chat() == [{"role": "assistant", "content": "It is 5."}]
    cut = Conversation.from_text("It is", tokenizer=tokenizer)
    assert cut[0].content == "It is" and not cut[0].is_complete
    # a trailing generation prompt with nothing generated is not a message
    assert len(Conversation.from_text(TORCHRL_CHATML_TEXT + "<|im_start|>assistant\n")) == 5
    batch = Conversation.from_text([TORCHRL_CHATML_TEXT, "x"])
    assert isinstance(batch, ConversationBatch) and [len(h) for h in batch] == [5, 1]


def test_llama3_named_template_round_trip():
    h = Conversation.from_chats(CHAT)
    text = h.apply_chat_template(chat_template_name="llama3", add_generation_prompt=False)
    assert text.startswith("<|start_header_id|>system<|end_header_id|>\n\nYou are a calculator.<|eot_id|>")
    back = Conversation.from_text(text, chat_template_name="llama3")
    assert back.to_chat() == Conversation.from_chats(CHAT).to_chat()


def test_tokenizer_without_template_falls_back_to_chatml(tokenizer):
    import copy

    bare = copy.deepcopy(tokenizer)
    bare.chat_template = None
    assert Conversation.from_chats(CHAT).apply_chat_template(bare, add_generation_prompt=False) == TORCHRL_CHATML_TEXT


def test_batch_template_pads_ragged_conversations(tokenizer):
    batch = Conversation.from_chats([CHAT, CHAT[:2]])
    out = batch.apply_chat_template(
        tokenizer, chat_template_name="chatml", add_generation_prompt=False, return_assistant_tokens_mask=True
    )
    assert out.input_ids.shape == (2, len(TORCHRL_INPUT_IDS))
    assert out.attention_mask.sum(1).tolist() == [len(TORCHRL_INPUT_IDS), 22]
    assert out.assistant_masks[1].sum() == 0 and out.input_ids[1, 22:].eq(tokenizer.pad_token_id).all()


def test_content_parts():
    h = Conversation([Message("user", [ContentBase("text", text="a"), {"type": "text", "text": "b"}])])
    assert h.apply_chat_template(chat_template_name="chatml", add_generation_prompt=False) == (
        "<|im_start|>user\nab<|im_end|>\n"
    )
    with pytest.raises(ValueError, match="cannot render a 'image' content part"):
        Conversation([Message("user", [ContentBase("image", url="x.png")])]).apply_chat_template(
            chat_template_name="chatml"
        )


def test_content_parts_are_torchrls_tensorclass():
    """As TorchRL's ``ContentBase``: a tensorclass whose parts stack (the docstring's ``lazy_stack`` example), with
    the ``size`` and ``function_*`` fields; a copied message keeps its parts."""
    import copy

    from tensordict import TensorClass, lazy_stack

    text = ContentBase(type="text", text="Hello, world!")
    image = ContentBase(type="image", url="https://example.com/image.jpg", size=3)
    assert isinstance(text, TensorClass) and text.batch_size == () and image.size == 3
    stacked = lazy_stack([text, image])
    assert stacked.batch_size == (2,) and list(stacked.type) == ["text", "image"]
    call = ContentBase("tool_call", function_name="add", function_args={"a": 1})
    assert call.to_dict() == {"type": "tool_call", "function_name": "add", "function_args": {"a": 1}}
    message = Message("user", [text, {"type": "text", "text": " again"}])
    assert copy.deepcopy(message).text == "Hello, world! again"
    with pytest.raises(ValueError, match="unknown field"):
        ContentBase.from_dict({"type": "text", "text": "a", "colour": "red"})


def test_as_padded_and_nested_tensor():
    items = [torch.tensor([1, 2, 3]), torch.tensor([4]), [5, 6]]
    right, mask = as_padded_tensor(items, padding_value=-1, return_mask=True)
    assert right.tolist() == [[1, 2, 3], [4, -1, -1], [5, 6, -1]]
    assert mask.tolist() == [[True] * 3, [True, False, False], [True, True, False]]
    left = as_padded_tensor(items, padding_side="left")
    assert left.tolist() == [[1, 2, 3], [0, 0, 4], [0, 5, 6]]
    nested = as_nested_tensor(items)
    assert nested.is_nested and [t.tolist() for t in nested.unbind()] == [[1, 2, 3], [4], [5, 6]]
    with pytest.raises(ValueError, match="item 0 must be 1-D"):
        as_padded_tensor([torch.zeros(2, 2)])


def test_masks_agree_with_transformers_generation_markers(tokenizer):
    """Independent check: HF computes masks from {% generation %} markers; ours from rendered prefixes."""
    marked = (
        "{% for m in messages %}{% if m['role'] == 'assistant' %}"
        "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ m['content'] + '<|im_end|>' }}{% endgeneration %}"
        "{{ '\\n' }}{% else %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    chat = CHAT + [{"role": "user", "content": "And 3+4?"}, {"role": "assistant", "content": " 7 \n"}]
    hf = tokenizer.apply_chat_template(
        chat, chat_template=marked, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ours = Conversation.from_chats(chat).apply_chat_template(
        tokenizer, chat_template=marked, add_generation_prompt=False, return_assistant_tokens_mask=True
    )
    assert ours.input_ids.tolist() == list(hf["input_ids"])
    assert ours.assistant_masks.long().tolist() == list(hf["assistant_masks"])
