"""A multi-turn calculator agent written with the plain ``openai`` client only (no llmrl import).

The model is offered a ``calculator`` tool (``tools=`` in the request). Each turn, a tool call it writes
(``<tool_call>{"name": "calculator", "arguments": {"expression": ...}}</tool_call>``, returned by the endpoint as
an OpenAI ``tool_calls`` entry) is executed by this agent and its result sent back as a ``tool`` message; a reply
without a tool call is the final answer. At most 3 model turns. The episode pays 1.0 when the number in the final
``<answer>...</answer>`` is the right one, else 0.0 (``success`` says the same, for the evaluation).

One worked example (a tool call, its result, the answer) comes before the question as earlier chat turns: the
packaged 135M model's chat template does not describe tools by itself.
"""

from __future__ import annotations

import json
import re

MAX_TURNS = 3
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression of numbers and + - * / ( ).",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
SYSTEM = (
    "You are a careful assistant with a calculator. To use it, write "
    '<tool_call>{"name": "calculator", "arguments": {"expression": "..."}}</tool_call> and wait for the result. '
    "Then give the final result as <answer>NUMBER</answer>."
)
EXAMPLE = [
    {"role": "user", "content": "What is 347 * 86?"},
    {
        "role": "assistant",
        "content": '<tool_call>{"name": "calculator", "arguments": {"expression": "347 * 86"}}</tool_call>',
    },
    {"role": "tool", "content": "29842"},
    {"role": "assistant", "content": "<answer>29842</answer>"},
]
ANSWER = re.compile(r"<answer>\s*(-?[\d,]+)\s*</answer>")


def calculator(expression: str) -> str:
    """The value of ``expression`` (digits, + - * / ( ) and spaces only), or an error text."""
    if not isinstance(expression, str) or not re.fullmatch(r"[\d\s+\-*/().]+", expression):
        return "error: only numbers and + - * / ( ) are allowed"
    try:
        value = eval(expression, {"__builtins__": {}})  # noqa: S307 - the characters are checked above
    except Exception as err:  # a syntax error or a division by zero is the tool's answer, not the agent's crash
        return f"error: {type(err).__name__}"
    return str(int(value)) if float(value).is_integer() else str(value)


def _run_tool(call) -> str:
    if call.function.name != "calculator":
        return f"error: no tool named {call.function.name!r}"
    try:
        arguments = json.loads(call.function.arguments or "{}")
    except ValueError:
        return "error: the arguments are not JSON"
    if not isinstance(arguments, dict):
        return "error: the arguments must be an object"
    expression = arguments.get("expression", next((v for v in arguments.values() if isinstance(v, str)), ""))
    return calculator(expression)


def final_number(text: str) -> str | None:
    """The number in the reply's ``<answer>`` tag (commas dropped), or None."""
    found = ANSWER.search(text or "")
    return found.group(1).replace(",", "") if found else None


def solve(row: dict, client) -> dict:
    """One episode on ``row["query"]`` (``row["answer"]`` ends with ``#### N``): up to 3 turns with the
    calculator; reward 1.0 for the right final number. Also returns ``success`` and ``tool_calls``."""
    target = str(row["answer"]).split("####")[-1].strip()
    messages = [{"role": "system", "content": SYSTEM}, *EXAMPLE, {"role": "user", "content": row["query"]}]
    calls = 0
    text = ""
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=64)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            text = message.content or ""
            break
        for call in message.tool_calls:
            calls += 1
            messages.append({"role": "tool", "tool_call_id": call.id, "content": _run_tool(call)})
    correct = final_number(text) == target
    return {"reward": float(correct), "success": float(correct), "tool_calls": float(calls)}
