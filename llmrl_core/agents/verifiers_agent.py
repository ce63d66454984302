"""A verifiers environment as an agent of the ``env.agent`` route (``env.verifiers``, docs/verifiers.md).

:func:`run_verifiers_episode` is the agent the flows run for every prompt row of a ``verifiers:`` source: it loads the
row's environment (once per process), runs the environment's own rollout (``env.run_rollout``: its turns, tools and
stop conditions) with an ``openai.AsyncOpenAI`` client pointed at the rollout engine's endpoint, and returns the
environment's rubric score as the reward, with the rubric's per-function scores as reward components. The endpoint
records every call against the episode and builds the exact-token training row, as for any agent.
"""

from __future__ import annotations

import json
import math
from typing import Any

from llmrl_core.builtin_data.verifiers_data import VerifiersSpec, load_env

AGENT_PATH = "llmrl_core.agents.verifiers_agent:run_verifiers_episode"
MODEL_NAME = "policy"  # the endpoint serves the policy under any model name


def rollout_input(row: dict[str, Any]) -> dict[str, Any]:
    """The environment's own ``RolloutInput`` for a row made by :func:`~llmrl_core.builtin_data.verifiers_data.
    verifiers_rows` (its prompt messages, answer, info, example id and task)."""
    if "verifiers_prompt" not in row or "verifiers_env" not in row:
        raise ValueError("a verifiers episode needs a row of a verifiers:train / verifiers:eval source")
    item: dict[str, Any] = {
        "prompt": json.loads(row["verifiers_prompt"]),
        "answer": str(row.get("answer") or ""),
        "info": json.loads(row.get("verifiers_info") or "{}"),
        "example_id": int(row.get("verifiers_example_id") or 0),
    }
    if row.get("verifiers_task"):
        item["task"] = row["verifiers_task"]
    return item


async def run_verifiers_episode(row: dict[str, Any], client: Any) -> dict[str, Any]:
    """One episode of the row's verifiers environment against the endpoint ``client`` talks to; returns
    ``{"reward": <rubric score>, <rubric function>: <its score>, ...}``. An episode the environment ends with an
    error (a failed model call, a prompt past the context) raises, so it fails alone."""
    from verifiers.clients import OpenAIChatCompletionsClient

    env = load_env(VerifiersSpec.from_json(row["verifiers_env"]))
    output = await env.run_rollout(
        rollout_input(row), OpenAIChatCompletionsClient(client), MODEL_NAME, dict(env.sampling_args or {})
    )
    if output.get("error") is not None:
        raise RuntimeError(f"the verifiers rollout ended with an error: {output['error']}")
    reward = float(output.get("reward") or 0.0)
    if not math.isfinite(reward):
        raise ValueError(f"the verifiers rubric returned a non-finite reward {reward!r}")
    components = {
        str(name): float(value)
        for name, value in (output.get("metrics") or {}).items()
        if isinstance(value, int | float) and math.isfinite(float(value))
    }
    return {"reward": reward, **components}
