"""Answer GSM8K questions on a vLLM engine and keep each response with its per-token log-probs."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmrl_core.builtin_data import gsm8k_gold, load_gsm8k
from llmrl_core.modules.backends.transformers.scoring import render_chat_prompt
from llmrl_core.modules.backends.vllm.engine import generate


@dataclass
class AnswerStats:
    """Totals of one answering run."""

    questions: int
    tokens: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per wall-clock second."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def answer_gsm8k(
    llm: Any,
    questions: int = 8,
    split: str = "test",
    max_tokens: int = 192,
    temperature: float = 0.7,
    seed: int = 0,
    use_tqdm: bool = False,
) -> tuple[list[dict], AnswerStats]:
    """Sample one answer per GSM8K question; returns JSON-ready records and totals."""
    import time

    rows = load_gsm8k(split, limit=questions)
    tokenizer = llm.get_tokenizer()
    prompts = [render_chat_prompt(tokenizer, [{"role": "user", "content": r["question"]}]) for r in rows]
    start = time.perf_counter()
    results = generate(llm, prompts, max_tokens=max_tokens, temperature=temperature, seed=seed, use_tqdm=use_tqdm)
    elapsed = time.perf_counter() - start
    records = []
    for i, (row, [completion]) in enumerate(zip(rows, results, strict=True)):
        records.append(
            {
                "index": i,
                "question": row["question"],
                "gold": gsm8k_gold(row["answer"]),
                "response": completion.text,
                "finish_reason": completion.finish_reason,
                "prompt_token_ids": completion.prompt_token_ids,
                "response_token_ids": completion.token_ids,
                "sampler_logprobs": completion.logprobs,
            }
        )
    tokens = sum(len(r["response_token_ids"]) for r in records)
    return records, AnswerStats(len(records), tokens, elapsed)


def write_jsonl_atomic(path: Path, rows: list[dict]) -> Path:
    """Write ``rows`` as JSON lines to ``path`` via a temp file and rename (no partial file on crash)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def summarize(record: dict, width: int = 100) -> str:
    """One console line for a record: gold, length, mean log-prob and the start of the answer."""
    lps = record["sampler_logprobs"]
    mean_lp = sum(lps) / max(1, len(lps))
    snippet = " ".join(record["response"].split())[:width]
    return (
        f"Q{record['index']}: gold={record['gold']:>6}  tokens={len(lps):>3}  mean logprob={mean_lp:6.3f}  | {snippet}"
    )
