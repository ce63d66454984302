"""``llmrl demo``: the main job on the embedded defaults.

Today: the packaged SmolLM2 answers GSM8K questions on vLLM, and every response is written with
its per-token sampler log-probs. When the GRPO pipeline lands this command runs a small GRPO run.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import typer

from llmrl_core.paths import llmrl_home


def _write_jsonl_atomic(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    os.replace(tmp, path)


def demo(
    questions: int = typer.Option(8, "--questions", "-n", min=1, help="How many GSM8K test questions."),
    max_tokens: int = typer.Option(192, help="Maximum new tokens per answer."),
    temperature: float = typer.Option(0.7, help="Sampling temperature (0 = greedy)."),
    model: str = typer.Option("default", help="'default', a local folder or a Hugging Face id."),
    dtype: str = typer.Option("bfloat16", help="Engine dtype: bfloat16 (fast) or float32 (exact)."),
    seed: int = typer.Option(0, help="Sampling seed."),
    out: Path = typer.Option(None, help="Where to write responses.jsonl (default: under $LLMRL_HOME/runs)."),
) -> None:
    """Answer GSM8K questions with the packaged model on vLLM, with per-token log-probs."""
    from llmrl_core.builtin_data import gsm8k_gold, load_gsm8k
    from llmrl_core.model_store import resolve_model
    from llmrl_core.policies.hf_scoring import render_chat_prompt
    from llmrl_core.policies.vllm_engine import EngineConfig, generate, make_llm

    rows = load_gsm8k("test", limit=questions)
    typer.echo(f"[1/3] model: {resolve_model(model, progress=lambda m: typer.echo(f'      {m}'))}")
    typer.echo(f"[2/3] starting vLLM ({dtype}) ...")
    start = time.perf_counter()
    llm = make_llm(EngineConfig(model=model, dtype=dtype, seed=seed))
    typer.echo(f"      engine ready in {time.perf_counter() - start:.1f} s")
    tokenizer = llm.get_tokenizer()
    prompts = [render_chat_prompt(tokenizer, [{"role": "user", "content": r["question"]}]) for r in rows]
    typer.echo(f"[3/3] answering {len(rows)} GSM8K test questions ...")
    start = time.perf_counter()
    results = generate(llm, prompts, max_tokens=max_tokens, temperature=temperature, seed=seed, use_tqdm=True)
    elapsed = time.perf_counter() - start
    records = []
    n_tokens = 0
    for i, (row, [completion]) in enumerate(zip(rows, results, strict=True)):
        n_tokens += len(completion.token_ids)
        mean_lp = sum(completion.logprobs) / max(1, len(completion.logprobs))
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
        snippet = " ".join(completion.text.split())[:100]
        typer.echo(
            f"  Q{i}: gold={records[-1]['gold']:>6}  tokens={len(completion.token_ids):>3}  "
            f"mean logprob={mean_lp:6.3f}  ppl={math.exp(-mean_lp):6.2f}  | {snippet}"
        )
    out = out or llmrl_home() / "runs" / f"demo-{time.strftime('%Y%m%d-%H%M%S')}" / "responses.jsonl"
    _write_jsonl_atomic(out, records)
    typer.echo(f"{n_tokens} tokens in {elapsed:.1f} s ({n_tokens / elapsed:.0f} tok/s); wrote {out}")
