"""Flow ``gsm8k-demo``: the packaged model answers GSM8K questions; responses keep their log-probs.

Run it directly (``python -m flows.gsm8k_demo``) or as the ``gsm8k-demo/answer-gsm8k`` deployment in
``prefect.yaml``.
"""

from __future__ import annotations

from prefect import flow, get_run_logger

from tasks.answer_questions import answer_questions, demo_out_dir


@flow(name="gsm8k-demo")
def gsm8k_demo(
    questions: int = 8,
    max_tokens: int = 192,
    temperature: float = 0.7,
    model: str = "default",
    out_dir: str | None = None,
) -> dict:
    """Answer ``questions`` GSM8K test questions with vLLM and write ``responses.jsonl``."""
    out_dir = out_dir or demo_out_dir()
    summary = answer_questions(
        f"{out_dir}/responses.jsonl", questions=questions, max_tokens=max_tokens, temperature=temperature, model=model
    )
    get_run_logger().info(
        "wrote %s (%s tokens, %s tok/s)", summary["path"], summary["tokens"], summary["tokens_per_second"]
    )
    return summary


if __name__ == "__main__":
    gsm8k_demo()
