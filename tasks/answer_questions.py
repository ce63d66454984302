"""Stage: answer GSM8K questions on a vLLM engine and write the responses to a JSONL file."""

from __future__ import annotations

import time
from pathlib import Path

from prefect import task

from llmrl_core.jobs.gsm8k_answers import answer_gsm8k, write_jsonl_atomic
from llmrl_core.modules.backends.types import EngineConfig
from llmrl_core.modules.backends.vllm.engine import make_llm
from llmrl_core.paths import llmrl_home
from tasks.reporting import live_table


@task(name="answer-gsm8k-questions")
def answer_questions(
    out_path: str,
    questions: int = 8,
    max_tokens: int = 192,
    temperature: float = 0.7,
    model: str = "default",
    dtype: str = "auto",
    seed: int = 0,
) -> dict:
    """Start an engine, answer ``questions`` GSM8K test questions, write them (and a table artifact for the UI);
    returns a summary only."""
    llm = make_llm(EngineConfig(model=model, dtype=dtype, seed=seed))
    records, stats = answer_gsm8k(llm, questions=questions, max_tokens=max_tokens, temperature=temperature, seed=seed)
    path = write_jsonl_atomic(Path(out_path), records)
    live_table(
        "gsm8k-demo-answers",
        [{"question": r["question"], "gold": r["gold"], "response": r["response"]} for r in records],
        f"{len(records)} answers of the model, {stats.tokens} tokens at {stats.tokens_per_second:.1f} tok/s; {path}",
    )
    return {
        "path": str(path),
        "questions": stats.questions,
        "tokens": stats.tokens,
        "tokens_per_second": round(stats.tokens_per_second, 1),
    }


def demo_out_dir() -> str:
    """A new folder for the demo's answers: ``$LLMRL_HOME/runs/demo-flow-<date-time>``."""
    return str(llmrl_home() / "runs" / f"demo-flow-{time.strftime('%Y%m%d-%H%M%S')}")
