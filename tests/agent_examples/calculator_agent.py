"""Test agents written against the plain ``openai`` client only (no llmrl import), as a user would write them.

``solve``: a calculator-tool agent that makes exactly 3 tool calls per episode (a tool call the model writes is
run; when the model writes none, the agent runs the calculator itself on the question, as a fixed protocol)
and is paid for the right number in its final answer. ``flaky``: the same agent, except that the first episode
this process runs crashes and the second hangs. ``solve_async``: the same agent on an ``AsyncOpenAI`` client,
with the same crash/hang pattern under ``flaky_async``.
"""

import asyncio
import json
import os
import re
import threading
import time

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
SYSTEM = (
    'You can use a calculator: write <tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}'
    "</tool_call>. Give the final result as <answer>NUMBER</answer>."
)
TOOL_CALLS = 3


def calculator(expression: str) -> str:
    """The value of an expression of digits and + - * / ( ), or an error text."""
    if not re.fullmatch(r"[\d\s+\-*/().]+", expression or ""):
        return "error: only numbers and + - * / ( ) are allowed"
    try:
        return str(eval(expression, {"__builtins__": {}}))  # noqa: S307 - the characters are checked above
    except Exception as err:
        return f"error: {err}"


def _expression(question: str) -> str:
    found = re.search(r"[\d(][\d\s+\-*/()]*[\d)]", question)
    return found.group(0) if found else "0"


def _tool_turn(message, question: str) -> list:
    """The assistant message as sent back, then the tool result for it."""
    sent = message.model_dump(exclude_none=True)
    if message.tool_calls:
        call = message.tool_calls[0]
        try:
            expression = json.loads(call.function.arguments).get("expression", "")
        except (ValueError, AttributeError):
            expression = ""
        return [sent, {"role": "tool", "tool_call_id": call.id, "content": calculator(expression)}]
    expression = _expression(question)  # no call written: the protocol runs the calculator on the question
    return [sent, {"role": "tool", "content": f"calculator({expression}) = {calculator(expression)}"}]


def _reward(text: str, answer: str) -> float:
    target = answer.split("####")[-1].strip()
    numbers = re.findall(r"-?\d+", text or "")
    return (1.0 if target in numbers else 0.0) + (0.1 if "<answer>" in (text or "") else 0.0)


def solve(row: dict, client) -> dict:
    """One episode: 3 calculator calls, then the final answer; reward 1 for the right number (+0.1 for the tag).

    With ``CALC_AGENT_LOG`` set, the token ids the endpoint returned (``return_token_ids``) and the replies' text
    are appended to that file, one JSON line per episode (the tests compare them with the stored rows)."""
    question = row["query"]
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    extra = {"return_token_ids": True}
    received = []
    for _ in range(TOOL_CALLS):
        reply = client.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS, max_tokens=20, extra_body=extra
        )
        received.append(reply.choices[0])
        messages += _tool_turn(reply.choices[0].message, question)
    final = client.chat.completions.create(
        model="policy", messages=messages, tools=TOOLS, max_tokens=20, extra_body=extra
    )
    received.append(final.choices[0])
    text = final.choices[0].message.content or ""
    if os.environ.get("CALC_AGENT_LOG"):
        with open(os.environ["CALC_AGENT_LOG"], "a") as log:
            calls = [{"token_ids": c.model_extra["token_ids"], "content": c.message.content} for c in received]
            log.write(json.dumps({"question": question, "calls": calls}) + "\n")
    return {"reward": _reward(text, row["answer"]), "calculator_calls": float(TOOL_CALLS)}


_LOCK = threading.Lock()
_STARTED = [0]


def _nth_episode() -> int:
    with _LOCK:
        _STARTED[0] += 1
        return _STARTED[0]


def flaky(row: dict, client) -> dict:
    """``solve``, but this process's first episode crashes and its second one hangs."""
    n = _nth_episode()
    if n == 1:
        raise RuntimeError("the agent crashed")
    if n == 2:
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
        time.sleep(60)
    return solve(row, client)


async def solve_async(row: dict, client) -> float:
    """``solve`` on an ``AsyncOpenAI`` client, returning the reward alone."""
    question = row["query"]
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    for _ in range(TOOL_CALLS):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=20)
        messages += _tool_turn(reply.choices[0].message, question)
    final = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=20)
    return _reward(final.choices[0].message.content or "", row["answer"])


async def flaky_async(row: dict, client) -> float:
    """``solve_async``, but this process's first episode crashes and its second one hangs."""
    n = _nth_episode()
    if n == 1:
        raise ValueError("the async agent crashed")
    if n == 2:
        await asyncio.sleep(60)
    return await solve_async(row, client)


def not_an_agent(row: dict) -> float:
    """Takes no client: refused by the config."""
    return 0.0
