"""A tool-using verifiers environment written with verifiers' own public API (``vf.ToolEnv`` with a Python tool,
``vf.Rubric``, a ``datasets.Dataset`` of question/answer rows) for llmrl's tests:
``env.verifiers: {id: vf-tiny-tools, args: {max_turns: 3}}``. It has no eval split."""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


def correct(completion, answer, **kwargs) -> float:
    """1.0 when the last reply contains the answer."""
    last = completion[-1]
    content = last.get("content") if isinstance(last, dict) else getattr(last, "content", None)
    return 1.0 if isinstance(content, str) and answer in content else 0.0


def length_penalty(completion, **kwargs) -> float:
    """Minus the number of messages in the completion (fewer turns score higher)."""
    return -float(len(completion))


def load_environment(max_turns: int = 3) -> vf.Environment:
    """The environment: three sums to do with the ``add`` tool, at most ``max_turns`` model turns."""
    rows = [{"question": f"What is {a} + {b}? Use the add tool.", "answer": str(a + b)} for a, b in ((2, 3), (7, 5))]
    rubric = vf.Rubric(funcs=[correct, length_penalty], weights=[1.0, 0.1])
    return vf.ToolEnv(
        dataset=Dataset.from_list(rows),
        tools=[add],
        max_turns=max_turns,
        system_prompt="Use the add tool, then give the result.",
        rubric=rubric,
    )
