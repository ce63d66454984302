"""Server-sent events for ``stream: true`` requests of the agent endpoint.

The endpoint generates a call's whole reply first (the rollout records it, exact tokens and all) and then sends
it in OpenAI's streaming shape: per choice one chunk with the reply (role, content, tool calls, log-probs), one
with its ``finish_reason``, a usage chunk when ``stream_options.include_usage`` asks for it, then
``data: [DONE]``. A client that streams gets the same text as one that does not, in fewer chunks than a
token-by-token server would send.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any


def _event(payload: Mapping[str, Any] | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"


def _chat_delta(choice: Mapping[str, Any]) -> dict[str, Any]:
    message = choice["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
    return delta


def stream_events(response: Mapping[str, Any], body: Mapping[str, Any]) -> Iterator[str]:
    """The SSE lines of ``response`` (a ``chat.completion`` or ``text_completion`` as the endpoint answers it
    without streaming), for the request ``body``."""
    chat = response["object"] == "chat.completion"
    head = {k: response[k] for k in ("id", "created", "model", "system_fingerprint") if k in response}
    head["object"] = "chat.completion.chunk" if chat else "text_completion"
    for choice in response["choices"]:
        extra = {k: v for k, v in choice.items() if k not in ("index", "message", "text", "finish_reason", "logprobs")}
        if chat:
            first = {"index": choice["index"], "delta": _chat_delta(choice), "logprobs": choice.get("logprobs")}
            last = {"index": choice["index"], "delta": {}, "logprobs": None, "finish_reason": choice["finish_reason"]}
        else:
            first = {"index": choice["index"], "text": choice["text"], "logprobs": choice.get("logprobs")}
            last = {"index": choice["index"], "text": "", "logprobs": None, "finish_reason": choice["finish_reason"]}
        yield _event({**head, "choices": [{**first, "finish_reason": None, **extra}]})
        yield _event({**head, "choices": [last]})
    options = body.get("stream_options") or {}
    if isinstance(options, Mapping) and options.get("include_usage"):
        yield _event({**head, "choices": [], "usage": response["usage"]})
    yield _event("[DONE]")
