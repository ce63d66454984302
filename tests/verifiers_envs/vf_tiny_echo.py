"""A single-turn verifiers environment written with verifiers' own public API (``vf.SingleTurnEnv``, ``vf.Rubric``,
a ``datasets.Dataset`` of question/answer rows) for llmrl's tests: ``env.verifiers: {id: vf-tiny-echo}``."""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset

QUESTIONS = [
    ("Say the word apple.", "apple"),
    ("Say the word river.", "river"),
    ("Say the word cloud.", "cloud"),
    ("Say the word stone.", "stone"),
]


def says_answer(completion, answer, **kwargs) -> float:
    """1.0 when the reply contains the expected word."""
    return 1.0 if answer.lower() in reply_text(completion).lower() else 0.0


def brevity(completion, **kwargs) -> float:
    """Shorter replies score higher (so samples of one prompt differ)."""
    return 1.0 / (1.0 + len(reply_text(completion)))


def reply_text(completion) -> str:
    """The text of the last assistant message (a verifiers message object or a dict)."""
    last = completion[-1]
    content = last.get("content") if isinstance(last, dict) else getattr(last, "content", None)
    return content if isinstance(content, str) else ""


def load_environment(n_train: int = 4, n_eval: int = 2, system_prompt: str = "Answer in one word.") -> vf.Environment:
    """The environment: ``n_train`` training questions, ``n_eval`` held-out ones."""
    train = Dataset.from_list([{"question": q, "answer": a} for q, a in QUESTIONS[:n_train]])
    held_out = Dataset.from_list([{"question": q, "answer": a} for q, a in QUESTIONS[::-1][:n_eval]])
    rubric = vf.Rubric(funcs=[says_answer, brevity], weights=[1.0, 0.5])
    return vf.SingleTurnEnv(dataset=train, eval_dataset=held_out, system_prompt=system_prompt, rubric=rubric)
