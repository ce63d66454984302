"""Evaluation of policies: pass@k and standard errors, GSM8K scoring that matches training, reports.

* :mod:`~llmrl_core.evaluation.statistics`: unbiased pass@k, means with standard errors over questions,
  paired differences between two policies on the same questions.
* :mod:`~llmrl_core.evaluation.gsm8k_eval`: ``evaluate_gsm8k(engine, rows, n_samples, k_values, sampling)``
  with the training prompts and reward parser, greedy and sampled.
* :mod:`~llmrl_core.evaluation.results`: the result objects and their JSON files.
* :mod:`~llmrl_core.evaluation.report`: the table over versions, the curve PNG and the versions' answers side by
  side.
"""

from llmrl_core.evaluation.gsm8k_eval import evaluate_gsm8k, evaluate_ifeval, evaluate_prompts, gsm8k_prompt_ids
from llmrl_core.evaluation.report import format_rows, markdown_table, plot_curves, report_rows, side_by_side
from llmrl_core.evaluation.results import (
    EvaluationResult,
    ModeResult,
    QuestionOutcome,
    SampleOutcome,
    load_result,
    save_result,
)
from llmrl_core.evaluation.statistics import Estimate, mean_stderr, paired_difference, pass_at_k, pass_at_k_estimate

__all__ = [
    "Estimate",
    "EvaluationResult",
    "ModeResult",
    "QuestionOutcome",
    "SampleOutcome",
    "evaluate_gsm8k",
    "evaluate_ifeval",
    "evaluate_prompts",
    "format_rows",
    "gsm8k_prompt_ids",
    "load_result",
    "markdown_table",
    "mean_stderr",
    "paired_difference",
    "pass_at_k",
    "pass_at_k_estimate",
    "plot_curves",
    "report_rows",
    "side_by_side",
    "save_result",
]
