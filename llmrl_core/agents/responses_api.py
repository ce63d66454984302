"""OpenAI's Responses API (``POST /v1/responses``) on the agent endpoint, as a translation to and from its chat
completions: the request's ``instructions`` and ``input`` items become chat messages (``function_call`` items an
assistant message's tool calls, ``function_call_output`` items tool messages), its function tools chat tools; the
chat reply becomes ``output`` items (a ``message`` with ``output_text``, one ``function_call`` per tool call). So a
Responses-API call is generated, recorded and trained on exactly as the chat call it translates to.

The endpoint keeps no responses: ``previous_response_id`` is refused (send the whole ``input``, as clients do with
``store=false``). ``stream: true`` gets the finished response as events (``response.created``, each output item's
``response.output_item.added`` / ``.done``, ``response.completed``).
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from llmrl_core.agents.request_error import RequestError

_TEXT_PARTS = ("input_text", "output_text", "text")


def _text(content: Any, where: str) -> str:
    """The text of an input item's ``content``: a string, or text parts (other parts, e.g. images, are refused)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(f"{where}: content must be a string or a list of text parts", param="input")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind not in _TEXT_PARTS:
            raise RequestError(f"{where}: content part type {kind!r} is not supported (text only)", param="input")
        texts.append(str(part.get("text", "")))
    return "".join(texts)


def _messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": _text(body["instructions"], "instructions")})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise RequestError("input must be a non-empty string or list of items", param="input")
    for index, item in enumerate(items):
        where = f"input[{index}]"
        if not isinstance(item, Mapping):
            raise RequestError(f"{where} must be an object", param="input")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise RequestError(f"{where}: role {role!r} is not one of user, system, developer, assistant")
            messages.append({"role": role, "content": _text(item.get("content", ""), where)})
        elif kind == "function_call":
            call = {
                "id": str(item.get("call_id") or item.get("id")),
                "type": "function",
                "function": {"name": str(item.get("name")), "arguments": str(item.get("arguments") or "{}")},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # the same turn: its text, then its calls
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output", "")
            text = output if isinstance(output, str) else _text(output, where)
            messages.append({"role": "tool", "tool_call_id": str(item.get("call_id")), "content": text})
        elif kind == "reasoning":
            continue  # a reasoning summary from another model: not part of this model's context
        else:
            raise RequestError(f"{where}: item type {kind!r} is not supported", param="input")
    return messages


def _tools(body: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    tools = body.get("tools")
    if not tools:
        return None
    if not isinstance(tools, list):
        raise RequestError("tools must be a list", param="tools")
    out = []
    for tool in tools:
        kind = tool.get("type") if isinstance(tool, Mapping) else None
        if kind != "function":
            raise RequestError(f"tool type {kind!r} is not supported (function tools only)", param="tools")
        function = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
        out.append({"type": "function", "function": function})
    return out


def chat_body_from_responses(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat-completions request a Responses-API request ``body`` translates to."""
    if body.get("previous_response_id") or body.get("conversation"):
        raise RequestError(
            "the endpoint keeps no responses: send the whole input instead of previous_response_id / conversation",
            param="previous_response_id",
        )
    chat: dict[str, Any] = {"messages": _messages(body)}
    for key in ("model", "temperature", "top_p", "seed", "user", "episode_id", "return_token_ids"):
        if body.get(key) is not None:
            chat[key] = body[key]
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    text = body.get("text")
    if isinstance(text, Mapping) and isinstance(text.get("format"), Mapping):  # JSON mode / schema: chat's name
        chat["response_format"] = text["format"]
    tools = _tools(body)
    if tools is not None:
        chat["tools"] = tools
        choice = body.get("tool_choice")
        if isinstance(choice, Mapping) and choice.get("type") == "function":
            chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
        elif choice is not None:
            chat["tool_choice"] = choice
    return chat


def response_from_chat(chat: Mapping[str, Any], body: Mapping[str, Any]) -> dict[str, Any]:
    """The Responses-API ``response`` object for the chat completion ``chat`` (one choice) of ``body``."""
    choice = chat["choices"][0]
    message = choice["message"]
    output: list[dict[str, Any]] = []
    if message.get("content"):
        output.append(
            {
                "type": "message",
                "id": f"msg_{uuid.uuid4().hex}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": message["content"], "annotations": [], "logprobs": []}],
            }
        )
    for call in message.get("tool_calls") or []:
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{uuid.uuid4().hex}",
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
                "status": "completed",
            }
        )
    cut = choice["finish_reason"] == "length"
    usage = chat["usage"]
    response: dict[str, Any] = {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": chat.get("created", int(time.time())),
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "model": chat["model"],
        "instructions": body.get("instructions"),
        "output": output,
        "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": list(body.get("tools") or []),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "previous_response_id": None,
        "metadata": dict(body.get("metadata") or {}),
        "text": {"format": {"type": "text"}},
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        },
    }
    if "token_ids" in choice:
        response["token_ids"], response["prompt_token_ids"] = choice["token_ids"], chat.get("prompt_token_ids")
    return response


def response_stream_events(response: Mapping[str, Any]) -> Iterator[str]:
    """The finished ``response`` as Responses-API server-sent events."""
    sequence = itertools.count()

    def event(kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": next(sequence), **fields}
        return f"event: {kind}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n"

    started = {**response, "status": "in_progress", "output": [], "usage": None}
    yield event("response.created", response=started)
    yield event("response.in_progress", response=started)
    for index, item in enumerate(response["output"]):
        yield event("response.output_item.added", output_index=index, item={**item, "status": "in_progress"})
        yield event("response.output_item.done", output_index=index, item=item)
    done = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    yield event(done, response=response)
