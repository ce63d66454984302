"""Parse rendered chat text back into messages (``Conversation.from_text``).

Each supported format has a regular-expression parser. A final message without its end-of-turn marker (a
partial generation, e.g. cut by a token limit) is kept with ``is_complete=False``. Text with no chat markers
at all is read as a single assistant response, complete only if it ends with the given end-of-turn marker.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

_CHATML_MSG = re.compile(r"<\|im_start\|>([^\n<]*)\n(.*?)(<\|im_end\|>|(?=<\|im_start\|>)|\Z)", re.DOTALL)
_LLAMA3_MSG = re.compile(
    r"<\|start_header_id\|>(.*?)<\|end_header_id\|>\n\n(.*?)(<\|eot_id\|>|(?=<\|start_header_id\|>)|\Z)", re.DOTALL
)


def _parse(pattern: re.Pattern[str], text: str, end_marker: str) -> list[dict[str, Any]]:
    messages = []
    for match in pattern.finditer(text):
        role, content, end = match.group(1).strip(), match.group(2), match.group(3)
        messages.append({"role": role, "content": content, "is_complete": end == end_marker})
    # A trailing generation prompt with nothing generated yet is not a message.
    if messages and not messages[-1]["is_complete"] and messages[-1]["content"] == "":
        messages.pop()
    return messages


def parse_chatml(text: str) -> list[dict[str, Any]]:
    """Messages of a ChatML text (``<|im_start|>role\\ncontent<|im_end|>``)."""
    return _parse(_CHATML_MSG, text, "<|im_end|>")


def parse_llama3(text: str) -> list[dict[str, Any]]:
    """Messages of a Llama-3 text (``<|start_header_id|>role<|end_header_id|>\\n\\ncontent<|eot_id|>``)."""
    return _parse(_LLAMA3_MSG, text, "<|eot_id|>")


_LLAMA4_MSG = re.compile(
    r"<\|header_start\|>(.*?)<\|header_end\|>\n\n(.*?)(<\|eot\|>|(?=<\|header_start\|>)|\Z)", re.DOTALL
)


def parse_llama4(text: str) -> list[dict[str, Any]]:
    """Messages of a Llama-4 text (``<|header_start|>role<|header_end|>\\n\\ncontent<|eot|>``; TorchRL's "llama")."""
    return _parse(_LLAMA4_MSG, text, "<|eot|>")


PARSERS: dict[str, Callable[[str], list[dict[str, Any]]]] = {
    "chatml": parse_chatml,
    "llama3": parse_llama3,
    "llama4": parse_llama4,
}
_MARKERS = {"chatml": "<|im_start|>", "llama3": "<|start_header_id|>", "llama4": "<|header_start|>"}
END_MARKERS = {"chatml": "<|im_end|>", "llama3": "<|eot_id|>", "llama4": "<|eot|>"}


def detect_format(text: str) -> str | None:
    """The chat format whose markers appear in ``text`` (a rendered chat or a template), or None."""
    for name, marker in _MARKERS.items():
        if marker in text:
            return name
    return None


def parse_text(
    text: str, text_format: str | None = None, end_of_turn: str | None = None, role: str = "assistant"
) -> list[dict[str, Any]]:
    """Parse ``text`` into message dicts (role, content, is_complete).

    ``text_format`` is ``"chatml"``/``"llama3"``, or None to detect it from the markers. Bare text (no markers)
    becomes one ``role`` message; it is complete when it ends with ``end_of_turn`` (which is then removed).
    """
    fmt = text_format or detect_format(text)
    if fmt is not None and _MARKERS[fmt] in text:
        if fmt not in PARSERS:
            raise ValueError(f"unknown text format {fmt!r}; known: {sorted(PARSERS)}")
        return PARSERS[fmt](text)
    end = end_of_turn or (END_MARKERS.get(fmt) if fmt else None)
    if end and text.endswith(end):
        return [{"role": role, "content": text[: -len(end)], "is_complete": True}]
    return [{"role": role, "content": text, "is_complete": False}]
