"""A test agent written with the OpenAI Agents SDK (``openai-agents``: ``Agent``, ``Runner``, ``function_tool``) on a
chat-completions model over the client it is given, as a user of that SDK would write it (no llmrl import).
``solve`` runs it with ``Runner.run``; ``solve_streamed`` with ``Runner.run_streamed`` (the SDK then calls the
endpoint with ``stream=True``)."""

import re

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    RunConfig,
    Runner,
    function_tool,
)


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression of digits and + - * / ( )."""
    if not re.fullmatch(r"[\d\s+\-*/().]+", expression or ""):
        return "error: only numbers and + - * / ( ) are allowed"
    return str(eval(expression, {"__builtins__": {}}))  # noqa: S307 - the characters are checked above


def _agent(client) -> Agent:
    return Agent(
        name="calculator",
        instructions="Use the calculator tool, then give the result as <answer>NUMBER</answer>.",
        model=OpenAIChatCompletionsModel(model="policy", openai_client=client),
        model_settings=ModelSettings(max_tokens=96),
        tools=[calculator],
    )


def _reward(text: str, row: dict) -> float:
    return float(f"<answer>{row['answer'].split('####')[-1].strip()}</answer>" in text)


async def solve(row, client):
    result = await Runner.run(_agent(client), row["query"], max_turns=3, run_config=RunConfig(tracing_disabled=True))
    return _reward(str(result.final_output or ""), row)


async def solve_streamed(row, client):
    run = Runner.run_streamed(_agent(client), row["query"], max_turns=3, run_config=RunConfig(tracing_disabled=True))
    async for _ in run.stream_events():
        pass
    return _reward(str(run.final_output or ""), row)


async def solve_responses(row, client):
    """The same agent on the SDK's Responses-API model (``POST /v1/responses``)."""
    from agents import OpenAIResponsesModel

    agent = _agent(client).clone(model=OpenAIResponsesModel(model="policy", openai_client=client))
    result = await Runner.run(agent, row["query"], max_turns=3, run_config=RunConfig(tracing_disabled=True))
    return _reward(str(result.final_output or ""), row)
