"""OpenAI chat messages on a Hugging Face tokenizer: normalising request messages, rendering the model's chat
template (``tools=`` included) and reading tool calls out of a sampled reply.

Tool calls are read in the Hermes format most open chat templates use (and llmrl's MCP calculator prompt):
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``. vLLM's own Hermes parser needs the tags to be
single tokens of the vocabulary, which small models (the packaged SmolLM2) lack, so the text is parsed here.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def content_text(content: Any) -> str:
    """A message's content as text: a string, ``None`` (a tool-call-only reply) or a list of content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type", "text") == "text":
                parts.append(str(part.get("text", "")))
            else:
                raise ValueError(f"only text content parts are supported, got {part!r}")
        return "".join(parts)
    raise ValueError(f"message content must be a string, null or a list of text parts, got {content!r}")


def normalize_tool_call(call: Mapping[str, Any]) -> dict[str, Any]:
    """``{"id", "type": "function", "function": {"name", "arguments"}}`` with the arguments as JSON text."""
    function = call.get("function") or {}
    arguments = function.get("arguments", "{}")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    return {
        "id": str(call.get("id") or ""),
        "type": "function",
        "function": {"name": str(function.get("name", "")), "arguments": arguments},
    }


def normalize_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """One request message as a plain dict: ``role``, ``content`` (text) and, where present, ``tool_calls``,
    ``tool_call_id`` and ``name`` (fields that are null are dropped)."""
    if not isinstance(message, Mapping) or "role" not in message:
        raise ValueError(f"each message needs a 'role', got {message!r}")
    out: dict[str, Any] = {"role": str(message["role"]), "content": content_text(message.get("content"))}
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = [normalize_tool_call(c) for c in calls]
    for key in ("tool_call_id", "name"):
        if message.get(key) is not None:
            out[key] = str(message[key])
    return out


def same_reply(sent: Mapping[str, Any], returned: Mapping[str, Any]) -> bool:
    """Whether an assistant message an agent sent back is the reply the endpoint gave (content and tool calls'
    names and arguments; ids and null fields aside)."""

    def calls(m: Mapping[str, Any]) -> list[tuple[str, Any]]:
        out = []
        for c in m.get("tool_calls") or []:
            arguments = c["function"]["arguments"]
            try:
                arguments = json.loads(arguments)
            except (TypeError, ValueError):
                pass
            out.append((c["function"]["name"], arguments))
        return out

    return (
        sent.get("role") == "assistant"
        and sent.get("content", "") == returned.get("content", "")
        and calls(sent) == calls(returned)
    )


def _template_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message as chat templates expect it: tool-call arguments as objects (as vLLM's server passes them)."""
    out = dict(message)
    if "tool_calls" in out:
        rendered = []
        for call in out["tool_calls"]:
            arguments = call["function"]["arguments"]
            try:
                arguments = json.loads(arguments)
            except (TypeError, ValueError):
                pass
            rendered.append({**call, "function": {"name": call["function"]["name"], "arguments": arguments}})
        out["tool_calls"] = rendered
    return out


def render_chat(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
) -> str:
    """The model's chat template applied to normalised ``messages`` (and ``tools``), as text."""
    kwargs: dict[str, Any] = {"tools": list(tools)} if tools else {}
    return tokenizer.apply_chat_template(
        [_template_message(m) for m in messages],
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        **kwargs,
    )


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """``(content, tool_calls)`` of a sampled reply: Hermes ``<tool_call>`` blocks whose JSON names a function
    become OpenAI tool calls; the text before the first block is the content (``None`` when empty). A reply
    without a valid block is all content."""
    calls = []
    for match in TOOL_CALL.finditer(text):
        try:
            payload = json.loads(match.group(1))
        except ValueError:
            continue
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            continue
        arguments = payload.get("arguments", payload.get("parameters", {}))
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": payload["name"],
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
        )
    if not calls:
        return text, []
    content = text[: text.find("<tool_call>")].strip()
    return (content or None), calls
