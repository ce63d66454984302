"""The IFEval reward: TorchRL's weighting of the four metrics plus a bonus for the think/answer format.

``reward = 0.4 * prompt_strict + 0.3 * inst_strict + 0.2 * prompt_loose + 0.1 * inst_loose + bonus`` where
the prompt-level terms are 0/1, the instruction-level terms are the fraction of the prompt's instructions
followed, and ``bonus`` is 0.1 for exactly one ``<answer>...</answer>`` block plus 0.05 for exactly one
``<think>...</think>`` block. The reward lies in [0, 1.15]. These are TorchRL 0.14.1's values
(``IfEvalScorer.default_reward_aggregator``); the weights are configurable.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from llmrl_core.envs.ifeval.evaluation import IFEvalScoreData

IFEVAL_WEIGHTS: tuple[float, float, float, float] = (0.4, 0.3, 0.2, 0.1)
ANSWER_BONUS = 0.1
THINK_BONUS = 0.05

_BLOCKS = {tag: re.compile(rf"<{tag}>(.*?)</{tag}>", re.DOTALL) for tag in ("think", "answer")}


def extract_blocks(text: str, tag: str) -> list[str]:
    """Contents of every closed ``<tag>...</tag>`` block in ``text`` (``tag`` is ``"think"`` or ``"answer"``)."""
    try:
        pattern = _BLOCKS[tag]
    except KeyError:
        raise ValueError(f"tag must be 'think' or 'answer', got {tag!r}") from None
    return pattern.findall(text)


def metric_components(score: IFEvalScoreData) -> tuple[float, float, float, float]:
    """The four reward terms in weight order: prompt strict, inst strict (fraction), prompt loose, inst loose."""
    return (
        float(score.prompt_level_strict_acc),
        score.inst_level_strict_fraction,
        float(score.prompt_level_loose_acc),
        score.inst_level_loose_fraction,
    )


def format_bonus(think_blocks: Sequence[str], answer_blocks: Sequence[str]) -> float:
    """0.1 for exactly one answer block plus 0.05 for exactly one think block."""
    return (ANSWER_BONUS if len(answer_blocks) == 1 else 0.0) + (THINK_BONUS if len(think_blocks) == 1 else 0.0)


def ifeval_reward(
    score: IFEvalScoreData,
    think_blocks: Sequence[str] = (),
    answer_blocks: Sequence[str] = (),
    weights: Sequence[float] = IFEVAL_WEIGHTS,
) -> float:
    """Weighted IFEval metrics plus the format bonus (see the module docstring)."""
    if len(weights) != 4:
        raise ValueError(f"weights must have 4 entries (prompt/inst strict, prompt/inst loose), got {weights}")
    weighted = sum(w * c for w, c in zip(weights, metric_components(score), strict=True))
    return float(weighted + format_bonus(think_blocks, answer_blocks))
