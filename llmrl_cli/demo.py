"""``llmrl demo``: the main job on the embedded defaults.

Today: the packaged SmolLM2 answers GSM8K questions on vLLM, and every response is written with
its per-token sampler log-probs. When the GRPO pipeline lands this command runs a small GRPO run.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer

from llmrl_core.paths import llmrl_home


def demo(
    questions: int = typer.Option(8, "--questions", "-n", min=1, help="How many GSM8K test questions."),
    max_tokens: int = typer.Option(192, help="Maximum new tokens per answer."),
    temperature: float = typer.Option(0.7, help="Sampling temperature (0 = greedy)."),
    model: str = typer.Option("default", help="'default', a local folder or a Hugging Face id."),
    dtype: str = typer.Option("auto", help="Engine dtype: auto (bf16 where native, else float32), bfloat16, float32."),
    seed: int = typer.Option(0, help="Sampling seed."),
    out: Path = typer.Option(None, help="Where to write responses.jsonl (default: under $LLMRL_HOME/runs)."),
) -> None:
    """Answer GSM8K questions with the packaged model on vLLM, with per-token log-probs."""
    from llmrl_core.jobs.gsm8k_answers import answer_gsm8k, summarize, write_jsonl_atomic
    from llmrl_core.model_store import resolve_model
    from llmrl_core.modules.backends.types import EngineConfig
    from llmrl_core.modules.backends.vllm.engine import make_llm

    typer.echo(f"[1/3] model: {resolve_model(model, progress=lambda m: typer.echo(f'      {m}'))}")
    typer.echo(f"[2/3] starting vLLM ({dtype}) ...")
    start = time.perf_counter()
    llm = make_llm(EngineConfig(model=model, dtype=dtype, seed=seed))
    typer.echo(f"      engine ready in {time.perf_counter() - start:.1f} s")
    typer.echo(f"[3/3] answering {questions} GSM8K test questions ...")
    records, stats = answer_gsm8k(
        llm, questions=questions, max_tokens=max_tokens, temperature=temperature, seed=seed, use_tqdm=True
    )
    for record in records:
        typer.echo("  " + summarize(record))
    out = out or llmrl_home() / "runs" / f"demo-{time.strftime('%Y%m%d-%H%M%S')}" / "responses.jsonl"
    write_jsonl_atomic(out, records)
    typer.echo(f"{stats.tokens} tokens in {stats.seconds:.1f} s ({stats.tokens_per_second:.0f} tok/s); wrote {out}")
