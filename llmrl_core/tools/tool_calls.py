"""Find the tool calls in an assistant message: JSON forms and XML-tag forms.

Accepted forms (``format="auto"`` tries all of them, in order of appearance in the text):

XML-tag forms (TorchRL's two spellings)::

    <tool>calculator.add
    {"a": 2, "b": 3}</tool>

    <tool name="calculator.add" tag="t1">{"a": 2, "b": 3}</tool>

  The first line after ``<tool>`` (or the ``name`` attribute) is the tool name, the rest is a JSON object of
  arguments (empty means no arguments).

JSON forms::

    <tool_call>{"name": "calculator.add", "arguments": {"a": 2, "b": 3}}</tool_call>

    ```json
    {"name": "calculator.add", "arguments": {"a": 2, "b": 3}}
    ```

    {"message": "Let me add.", "tools": [{"tool": "calculator.add", "args": {"a": 2, "b": 3}}]}

  A JSON call object names the tool with ``name`` or ``tool`` and its arguments with ``arguments`` or
  ``args`` (an object, or a string holding a JSON object, as OpenAI-style APIs send it); a ```` ```json ````
  block or ``<tool_call>`` may hold one object or a list. The last form is TorchRL's ``JSONCallParser``
  shape: the whole message is one JSON object with a ``tools`` list.

A call whose arguments do not parse is still returned, with ``error`` set, so the environment can tell
the model what was wrong instead of silently ignoring it. ``parse_tool_calls`` never raises on model text.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from llmrl_core.envs.transforms.tool_calls import ToolCall

ToolCallFormat = Literal["auto", "json", "xml"]

_XML_NAMED = re.compile(
    r'<tool\s+name="(?P<name>[^"]+)"(?:\s+tag="(?P<tag>[^"]*)")?\s*>(?P<body>.*?)</tool>', re.DOTALL
)
_XML_PLAIN = re.compile(r"<tool>\s*(?P<name>[^\s<]+)[ \t]*(?:\n(?P<body>.*?))?</tool>", re.DOTALL)
_JSON_TAG = re.compile(r"<tool_call>(?P<body>.*?)</tool_call>", re.DOTALL)
_JSON_FENCE = re.compile(r"```json[ \t]*\n(?P<body>.*?)\n?```", re.DOTALL)


def _parse_args(body: str | None, where: str) -> tuple[dict[str, Any], str | None]:
    text = (body or "").strip()
    if not text:
        return {}, None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return {}, f"{where}: arguments are not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    if not isinstance(value, dict):
        return {}, f"{where}: arguments must be a JSON object, got {type(value).__name__}"
    return value, None


def _call_from_obj(obj: Any, form: str, start: int) -> ToolCall | None:
    if not isinstance(obj, dict):
        return None
    name = obj.get("name", obj.get("tool"))
    if "function" in obj and isinstance(obj["function"], dict):  # {"type": "function", "function": {...}}
        return _call_from_obj(obj["function"], form, start)
    if not isinstance(name, str) or not name:
        return None
    args = obj.get("arguments", obj.get("args", obj.get("parameters", {})))
    error = None
    if isinstance(args, str):
        args, error = _parse_args(args, f"tool call {name!r}")
    elif args is None:
        args = {}
    elif not isinstance(args, dict):
        args, error = {}, f"tool call {name!r}: arguments must be a JSON object, got {type(args).__name__}"
    tag = obj.get("tag", obj.get("id"))
    return ToolCall(name, args, str(tag) if tag is not None else None, form, error, start)


def _calls_from_json_text(body: str, form: str, start: int) -> list[ToolCall]:
    try:
        value = json.loads(body.strip())
    except json.JSONDecodeError as exc:
        return [ToolCall("", {}, None, form, f"{form}: not valid JSON ({exc.msg})", start)]
    items = value if isinstance(value, list) else [value]
    calls = [c for item in items if (c := _call_from_obj(item, form, start)) is not None]
    if not calls and form == "tool_call":
        return [ToolCall("", {}, None, form, "tool_call: expected an object with 'name' and 'arguments'", start)]
    return calls


def _xml_calls(text: str) -> list[ToolCall]:
    calls = []
    for m in _XML_NAMED.finditer(text):
        args, err = _parse_args(m.group("body"), f"tool {m.group('name')!r}")
        calls.append(ToolCall(m.group("name"), args, m.group("tag"), "xml", err, m.start()))
    for m in _XML_PLAIN.finditer(text):
        args, err = _parse_args(m.group("body"), f"tool {m.group('name')!r}")
        calls.append(ToolCall(m.group("name"), args, None, "xml", err, m.start()))
    return calls


def _json_calls(text: str) -> list[ToolCall]:
    calls = []
    for m in _JSON_TAG.finditer(text):
        calls.extend(_calls_from_json_text(m.group("body"), "tool_call", m.start()))
    for m in _JSON_FENCE.finditer(text):
        found = _calls_from_json_text(m.group("body"), "json", m.start())
        calls.extend(c for c in found if c.tool)  # a JSON block that is not a call is just JSON
    stripped = text.strip()
    if not calls and stripped.startswith("{") and stripped.endswith("}"):
        try:
            whole = json.loads(stripped)
        except json.JSONDecodeError:
            whole = None
        if isinstance(whole, dict) and isinstance(whole.get("tools"), list):
            calls.extend(c for item in whole["tools"] if (c := _call_from_obj(item, "json", 0)) is not None)
        elif isinstance(whole, dict) and (c := _call_from_obj(whole, "json", 0)) is not None:
            calls.append(c)
    return calls


def parse_tool_calls(text: str, format: ToolCallFormat = "auto") -> list[ToolCall]:
    """All tool calls in ``text``, in order of appearance; ``format`` restricts to JSON or XML forms."""
    if format not in ("auto", "json", "xml"):
        raise ValueError(f"format must be 'auto', 'json' or 'xml', got {format!r}")
    calls: list[ToolCall] = []
    if format in ("auto", "xml"):
        calls.extend(_xml_calls(text))
    if format in ("auto", "json"):
        calls.extend(_json_calls(text))
    return sorted(calls, key=lambda c: c.start)


def tool_call_record(turn: int, name: str, arguments: Any, result: str, error: bool) -> dict[str, Any]:
    """One executed tool call as stored in a trajectory row (``tool_calls``: turn, name, JSON arguments,
    result text, error flag); transforms append these to ``slot.info["tool_calls"]``."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, default=str)
    return {"turn": int(turn), "name": str(name), "arguments": text, "result": str(result), "error": bool(error)}
