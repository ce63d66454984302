"""TorchRL's named chat templates (``chat_template_name=`` "llama", "deepseek", "falcon", "dialogpt", "qwen",
"chatml_format"): llmrl's own templates render the same text and the same assistant masks as TorchRL 0.14.1
(``scripts/torchrl_template_goldens.py`` in the side venv -> ``tests/goldens/torchrl/chat_templates.json``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tensordict import lazy_stack

from llmrl_core.data.history import _CHAT_TEMPLATES, History

GOLDEN = json.loads((Path(__file__).parent / "goldens/torchrl/chat_templates.json").read_text())


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path)


@pytest.mark.parametrize("name", sorted(GOLDEN["names"]))
def test_named_templates_render_and_mask_as_torchrl(name, tokenizer):
    assert name in _CHAT_TEMPLATES
    for chat, want in zip(GOLDEN["chats"], GOLDEN["names"][name], strict=True):
        history = lazy_stack([History.from_chats([chat])[0]])
        for prompt in (False, True):
            text = history.apply_chat_template(
                tokenizer=tokenizer, chat_template_name=name, add_generation_prompt=prompt, tokenize=False
            )[0]
            assert text == want[f"text_{prompt}"], (name, prompt)
        tokens = history.apply_chat_template(
            tokenizer=tokenizer, chat_template_name=name, add_generation_prompt=False, tokenize=True,
            return_assistant_tokens_mask=True, return_dict=True,
        )  # fmt: skip
        assert tokens["input_ids"][0].tolist() == want["input_ids"]
        assert tokens["assistant_masks"][0].tolist() == want["assistant_masks"], name


def test_llama_text_reads_back_and_the_unmarked_formats_say_why_not():
    """The Llama-4 format parses back into its messages (as TorchRL reads it); the formats without turn markers are
    refused by name (TorchRL 0.14.1 raises on falcon and reads deepseek / dialogpt wrongly)."""
    chat = GOLDEN["chats"][0]
    text = GOLDEN["names"]["llama"][0]["text_False"]
    back = History.from_text(text, chat_template_name="llama")
    assert list(back.role) == [m["role"] for m in chat]
    assert list(back.content) == [chat[0]["content"].strip()] + [m["content"] for m in chat[1:]]
    for name in ("deepseek", "falcon", "dialogpt"):
        with pytest.raises(ValueError, match=f"from_text cannot read the '{name}' format"):
            History.from_text(GOLDEN["names"][name][0]["text_False"], chat_template_name=name)
