"""Chat-template rendering: the tokenizer's own template first, named fallbacks when it has none.

Two rules pick the template, both starting from an explicit ``chat_template`` string, then a
``chat_template_name`` from :data:`NAMED_TEMPLATES`:

* :func:`resolve_template` (the flows' rule, name :data:`MODEL_TEMPLATE`): then ``tokenizer.chat_template``, then
  ChatML. Prompts look exactly as the model was trained on.
* :func:`torchrl_template` (TorchRL's rule, what ``History.apply_chat_template`` and a ``ChatEnv`` use by
  default): then the Qwen template for a tokenizer whose name holds "qwen", then the tokenizer's own template
  only when it marks assistant turns with ``{% generation %}``, else ChatML. So a tokenizer whose own template
  adds a default system turn (SmolLM2's does) renders without it, as in TorchRL.

Assistant masks need no generation markers (see :func:`assistant_char_spans`).

Rendering goes through ``tokenizer.apply_chat_template`` when a tokenizer is given, otherwise through
transformers' own jinja renderer, so both paths produce the same text.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

# Our own templates. Each states its end-of-turn marker (the token the policy samples to finish a turn).
_CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_LLAMA3 = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class NamedTemplate:
    """A built-in chat template with the metadata needed to parse its output back into messages."""

    name: str
    template: str
    end_of_turn: str | None  # None: the tokenizer's end-of-sequence token
    text_format: str | None  # key into llmrl_core.data.text_parsing.PARSERS (None: no parser for the format)
    assistant_lead: str = ""  # text the template puts before an assistant's content that the assistant generates


# Qwen's chat format (TorchRL's "qwen"): ChatML with a default system turn when the chat does not open with one;
# a run of tool messages is one "tool" turn, each result (its tool_responses, else its content) in <tool_response>.
_QWEN = (
    "{% if not messages or messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{% endif %}"
    "{% for message in messages %}{% if message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{ '<|im_start|>tool' }}{% endif %}"
    "{{ '\\n<tool_response>\\n' }}{{ message['tool_responses'] or message['content'] }}{{ '\\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# The formats of TorchRL's other named templates ("llama", "deepseek", "falcon", "dialogpt"), written here:
# Llama 4 headers, a leading system message trimmed and dropped when empty; content given as a list of typed parts
# is its text parts, trimmed.
_TEXT_OF = (
    "{% macro text_of(content) %}{% if content is string %}{{ content }}{% else %}"
    "{% for part in content %}{% if part['type'] == 'text' %}{{ part['text'] | trim }}{% endif %}{% endfor %}"
    "{% endif %}{% endmacro %}"
)
_LLAMA4 = (
    _TEXT_OF + "{{ bos_token }}"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set system = messages[0]['content'] | trim %}{% set turns = messages[1:] %}"
    "{% else %}{% set system = '' %}{% set turns = messages %}{% endif %}"
    "{% if system %}{{ '<|header_start|>system<|header_end|>\n\n' + system + '<|eot|>' }}{% endif %}"
    "{% for message in turns %}"
    "{{ '<|header_start|>' + message['role'] + '<|header_end|>\n\n' }}{{ text_of(message['content']) }}"
    "{{ '<|eot|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|header_start|>assistant<|header_end|>\n\n' }}{% endif %}"
)
# "User: ..." / "Assistant: ..." turns; the assistant's reply (its leading space included) is what it generates.
_DEEPSEEK = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ 'User: ' + message['content'] + '\n\n' }}"
    "{% elif message['role'] == 'assistant' %}{{ 'Assistant: ' + message['content'] + eos_token }}"
    "{% elif message['role'] == 'system' %}{{ message['content'] + '\n\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
_FALCON = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ 'User: ' + message['content'] + '\n\n' }}"
    "{% elif message['role'] == 'assistant' %}{{ 'Assistant: ' + message['content'] + '\n' }}"
    "{% elif message['role'] == 'system' %}{{ message['content'] + '\n\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
# Turns separated by the end-of-sequence token, no roles, no system message.
_DIALOGPT = (
    "{% for message in messages %}{% if message['role'] in ('user', 'assistant') %}"
    "{{ message['content'] + eos_token }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ ' ' }}{% endif %}"
)

NAMED_TEMPLATES: dict[str, NamedTemplate] = {
    "chatml": NamedTemplate("chatml", _CHATML, "<|im_end|>", "chatml"),
    "llama3": NamedTemplate("llama3", _LLAMA3, "<|eot_id|>", "llama3"),
    "qwen": NamedTemplate("qwen", _QWEN, "<|im_end|>", "chatml"),
    "llama": NamedTemplate("llama", _LLAMA4, "<|eot|>", "llama4"),
    "deepseek": NamedTemplate("deepseek", _DEEPSEEK, None, None, assistant_lead=" "),
    "falcon": NamedTemplate("falcon", _FALCON, None, None, assistant_lead=" "),
    "dialogpt": NamedTemplate("dialogpt", _DIALOGPT, None, None),
}
# TorchRL's name for ChatML, accepted as an alias.
NAMED_TEMPLATES["chatml_format"] = NAMED_TEMPLATES["chatml"]
DEFAULT_FALLBACK = "chatml"
# ``chat_template_name`` that asks for the model's own template (the flows' rule, :func:`resolve_template`).
MODEL_TEMPLATE = "tokenizer"
GENERATION_MARKER = "{% generation %}"


@dataclass(frozen=True)
class ResolvedTemplate:
    """The template text to render with, and the end-of-turn marker of the assistant turns."""

    template: str
    end_of_turn: str | None
    source: str  # "explicit", "named:<name>", "tokenizer" or "fallback:<name>"
    assistant_lead: str = ""  # counted in the assistant mask (see NamedTemplate)


def named_template(name: str) -> NamedTemplate:
    """Look a built-in template up by name, with a clear error listing the known names."""
    try:
        return NAMED_TEMPLATES[name]
    except KeyError:
        raise ValueError(f"unknown chat_template_name {name!r}; known: {sorted(NAMED_TEMPLATES)}") from None


def detect_end_of_turn(template: str, tokenizer: Any = None) -> str | None:
    """Guess the end-of-turn marker of a template: a known marker it contains, else the tokenizer's EOS."""
    for marker in ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"):
        if marker in template:
            return marker
    return getattr(tokenizer, "eos_token", None) if tokenizer is not None else None


def resolve_template(
    tokenizer: Any = None, chat_template: str | None = None, chat_template_name: str | None = None
) -> ResolvedTemplate:
    """Pick the template to render with (explicit > named > tokenizer's own > ChatML fallback)."""
    if chat_template is not None:
        named = next((t for t in NAMED_TEMPLATES.values() if t.template == chat_template), None)
        if named is None:  # (a built-in template passed as text keeps its end of turn and assistant lead)
            return ResolvedTemplate(chat_template, detect_end_of_turn(chat_template, tokenizer), "explicit")
        chat_template_name = named.name
    if chat_template_name is not None and chat_template_name != MODEL_TEMPLATE:
        named = named_template(chat_template_name)
        end = named.end_of_turn or (getattr(tokenizer, "eos_token", None) if tokenizer is not None else None)
        return ResolvedTemplate(named.template, end, f"named:{named.name}", named.assistant_lead)
    own = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    if isinstance(own, str) and own:
        return ResolvedTemplate(own, detect_end_of_turn(own, tokenizer), "tokenizer")
    fallback = NAMED_TEMPLATES[DEFAULT_FALLBACK]
    if tokenizer is not None:
        _warn_fallback(str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__), fallback.name)
    return ResolvedTemplate(fallback.template, fallback.end_of_turn, f"fallback:{fallback.name}")


def torchrl_template(
    tokenizer: Any = None, chat_template: str | None = None, chat_template_name: str | None = None
) -> ResolvedTemplate:
    """Pick the template the way TorchRL's ``History.apply_chat_template`` does: explicit > named > Qwen's for a
    tokenizer named "qwen..." > the tokenizer's own when it has ``{% generation %}`` markers > ChatML.
    ``chat_template_name=MODEL_TEMPLATE`` ("tokenizer") asks for :func:`resolve_template`'s rule instead."""
    if chat_template is not None or chat_template_name is not None:
        return resolve_template(tokenizer, chat_template, chat_template_name)
    name = str(getattr(tokenizer, "name_or_path", "") or "").lower()
    if "qwen" in name:
        qwen = NAMED_TEMPLATES["qwen"]
        return ResolvedTemplate(qwen.template, qwen.end_of_turn, "family:qwen")
    own = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    if isinstance(own, str) and GENERATION_MARKER in own:
        return ResolvedTemplate(own, detect_end_of_turn(own, tokenizer), "tokenizer")
    chatml = NAMED_TEMPLATES["chatml"]
    return ResolvedTemplate(chatml.template, chatml.end_of_turn, "torchrl:chatml")


@functools.lru_cache(maxsize=64)
def _warn_fallback(tokenizer_name: str, fallback: str) -> None:
    """Say once per tokenizer that it has no chat template and which one renders its chats instead."""
    logging.getLogger("llmrl.templates").warning(
        "the tokenizer of %s has no chat template: chats are rendered with the %s template (set the env's "
        "chat_template_name, or add a chat_template to the model's tokenizer_config.json)",
        tokenizer_name,
        fallback,
    )


def render(
    messages: list[dict[str, Any]],
    template: str,
    *,
    tokenizer: Any = None,
    add_generation_prompt: bool = False,
    **template_kwargs: Any,
) -> str:
    """Render ``messages`` (role/content dicts) with ``template`` into one string (no tokenization)."""
    if tokenizer is not None:
        return tokenizer.apply_chat_template(
            messages,
            chat_template=template,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **template_kwargs,
        )
    from transformers.utils.chat_template_utils import render_jinja_template

    template_kwargs.setdefault("bos_token", "")
    template_kwargs.setdefault("eos_token", "")
    rendered, _ = render_jinja_template(
        [messages], chat_template=template, add_generation_prompt=add_generation_prompt, **template_kwargs
    )
    return rendered[0]


def assistant_char_spans(
    messages: list[dict[str, Any]],
    template: str,
    full_text: str,
    *,
    roles: tuple[str, ...] = ("assistant",),
    end_of_turn: str | None = None,
    include_end_of_turn: bool = True,
    tokenizer: Any = None,
    lead: str = "",
    **template_kwargs: Any,
) -> list[tuple[int, tuple[int, int]]]:
    """Character spans of each assistant message's content inside ``full_text``.

    For message ``i`` the conversation up to ``i`` is rendered with a generation prompt; the message's content
    is searched from the end of that prefix (templates are prefix-stable for the common families). The span
    covers the content and, when ``include_end_of_turn``, the end-of-turn marker right after it: it is the
    token the policy samples to stop, so the loss should see it; it starts at ``lead`` (text the template puts
    before the content as part of what the assistant generates, e.g. a space) when that lead precedes the content.
    Returns ``[(message_index, (start, end))]``.
    """
    spans: list[tuple[int, tuple[int, int]]] = []
    cursor = 0
    for index, message in enumerate(messages):
        if message["role"] not in roles:
            continue
        prefix = render(messages[:index], template, tokenizer=tokenizer, add_generation_prompt=True, **template_kwargs)
        search_from = len(prefix) if full_text.startswith(prefix) and len(prefix) >= cursor else cursor
        content = message["content"]
        start = full_text.find(content, search_from)
        if start < 0 and content.strip():
            content = content.strip()
            start = full_text.find(content, search_from)
        if start < 0:
            raise ValueError(
                f"message {index} (role {message['role']!r}) not found in the rendered chat; "
                "the chat template changes the content, cannot build an assistant mask"
            )
        end = start + len(content)
        if include_end_of_turn and end_of_turn and full_text.startswith(end_of_turn, end):
            end += len(end_of_turn)
        if lead and start >= len(lead) and full_text.startswith(lead, start - len(lead)):
            start -= len(lead)
        spans.append((index, (start, end)))
        cursor = end
    return spans


def char_spans_to_token_mask(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[bool]:
    """Token mask: True for tokens that start inside any of the char ``spans`` (``offsets`` per token)."""
    mask = []
    for tok_start, tok_end in offsets:
        inside = tok_end > tok_start and any(start <= tok_start < end for start, end in spans)
        mask.append(inside)
    return mask
