"""Structured message content: TorchRL's ``ContentBase`` tensorclass.

A message's ``content`` is either a plain string or a list of :class:`ContentBase` parts (text, image,
audio, file). Only text parts can be rendered by text-only chat templates; :func:`content_to_text` joins
them and refuses non-text parts with a clear error.
"""

from __future__ import annotations

import copy
from typing import Any

from tensordict import TensorClass

_FIELDS = ("type", "text", "url", "data", "mime_type", "name", "size", "function_name", "function_args")


class ContentBase(TensorClass["nocast", "shadow"]):
    """One part of a multi-part message content: TorchRL's tensorclass, with its fields in its order (``type``,
    ``text``, ``url``, ``data``, ``mime_type``, ``name``, ``size``, ``function_name``, ``function_args``); parts
    stack with ``lazy_stack``. A text part needs its ``text`` (checked for a single part)."""

    type: str
    text: str | None = None
    url: str | None = None
    data: str | None = None
    mime_type: str | None = None
    name: str | None = None
    size: int | None = None
    function_name: str | None = None
    function_args: dict | None = None

    def __post_init__(self) -> None:
        if not self.batch_dims and self.type == "text" and self.text is None:
            raise ValueError("ContentBase(type='text') needs a 'text' value")

    def __deepcopy__(self, memo: dict[int, Any]) -> ContentBase:
        return type(self).from_dict(copy.deepcopy(self.to_dict(), memo)) if not self.batch_dims else self.clone()

    def to_dict(self) -> dict[str, Any]:
        """The part as a dict without empty fields (the Hugging Face multimodal message format)."""
        values = ((name, getattr(self, name)) for name in _FIELDS)
        return {name: value for name, value in values if value is not None}

    @classmethod
    def from_dict(cls, part: dict[str, Any]) -> ContentBase:
        """Build a part from a dict such as ``{"type": "text", "text": "hi"}``."""
        if not isinstance(part, dict) or "type" not in part:
            raise ValueError(f"content part must be a dict with a 'type' field, got {part!r}")
        unknown = set(part) - set(_FIELDS)
        if unknown:
            raise ValueError(f"content part has unknown field(s) {sorted(unknown)}: {part!r}")
        return cls(**part)


Content = str | list[ContentBase]


def content_to_text(content: Content) -> str:
    """The text of a message content: the string itself, or its text parts joined."""
    if isinstance(content, str):
        return content
    texts = []
    for part in content:
        if part.type != "text":
            raise ValueError(f"cannot render a {part.type!r} content part with a text-only chat template")
        texts.append(part.text or "")
    return "".join(texts)


def normalize_content(content: Any) -> Content:
    """Accept a string, a list of parts (dicts or ContentBase); return str or list[ContentBase]."""
    if isinstance(content, str):
        return content
    if isinstance(content, list | tuple):
        return [part if isinstance(part, ContentBase) else ContentBase.from_dict(part) for part in content]
    raise TypeError(f"message content must be a string or a list of content parts, got {type(content).__name__}")
