"""IFEval's strict and loose evaluation of one response, the four metrics, and their dataset-level summary.

- *Strict*: each instruction is checked on the response as written; an empty (all-whitespace) response
  follows nothing.
- *Loose*: an instruction counts as followed if it holds on any of eight variants of the response: as
  written, without its first line, without its last line, without both, and each of those four with every
  ``*`` removed (markdown emphasis). Empty variants are skipped. This is IFEval's upper bound that forgives
  a preamble ("Sure, here it is:"), a closing remark, or bold markup.
- Prompt-level accuracy: all instructions of the prompt followed. Instruction-level accuracy: the fraction
  of instructions followed; over a dataset it is pooled over all instructions (IFEval's definition), not
  averaged per prompt.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from llmrl_core.envs.ifeval.registry import check_instruction, validate_instructions


@dataclass(frozen=True)
class IFEvalScoreData:
    """The IFEval result of one response to one prompt (the four metrics, per instruction where it applies).

    ``inst_level_*_acc`` holds one bool per instruction, in the order of ``instruction_id_list``; the
    ``*_fraction`` properties give their mean, which is what the reward weights.
    """

    instruction_id_list: tuple[str, ...]
    prompt_level_strict_acc: bool
    inst_level_strict_acc: tuple[bool, ...]
    prompt_level_loose_acc: bool
    inst_level_loose_acc: tuple[bool, ...]

    @property
    def inst_level_strict_fraction(self) -> float:
        """Fraction of this prompt's instructions followed strictly (0.0 when there are none)."""
        return _mean(self.inst_level_strict_acc)

    @property
    def inst_level_loose_fraction(self) -> float:
        """Fraction of this prompt's instructions followed loosely (0.0 when there are none)."""
        return _mean(self.inst_level_loose_acc)

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python form (lists instead of tuples), e.g. for a Parquet ``reward_components`` column."""
        return {key: list(value) if isinstance(value, tuple) else value for key, value in asdict(self).items()}


def _mean(flags: Sequence[bool]) -> float:
    return sum(flags) / len(flags) if flags else 0.0


def loose_variants(response: str) -> list[str]:
    """The eight response variants of IFEval's loose evaluation (see the module docstring), in IFEval's order."""
    lines = response.split("\n")
    remove_first = "\n".join(lines[1:]).strip()
    remove_last = "\n".join(lines[:-1]).strip()
    remove_both = "\n".join(lines[1:-1]).strip()
    cut = [response, remove_first, remove_last, remove_both]
    return [response, response.replace("*", ""), *cut[1:], *(text.replace("*", "") for text in cut[1:])]


def follows_strict(instruction_id: str, response: str, kwargs: Mapping[str, Any] | None) -> bool:
    """Strict: the instruction holds on the response as written (an empty response follows nothing)."""
    return bool(response.strip()) and check_instruction(instruction_id, response, kwargs)


def follows_loose(instruction_id: str, variants: Sequence[str], kwargs: Mapping[str, Any] | None) -> bool:
    """Loose: the instruction holds on at least one non-empty variant from :func:`loose_variants`."""
    return any(text.strip() and check_instruction(instruction_id, text, kwargs) for text in variants)


def score_response(
    instruction_id_list: Sequence[str], kwargs_list: Sequence[Mapping[str, Any] | None], response: str
) -> IFEvalScoreData:
    """Score ``response`` against a prompt's instructions: the four IFEval metrics in one record."""
    validate_instructions(instruction_id_list, kwargs_list)
    variants = loose_variants(response)
    strict = tuple(follows_strict(iid, response, kw) for iid, kw in zip(instruction_id_list, kwargs_list, strict=True))
    loose = tuple(follows_loose(iid, variants, kw) for iid, kw in zip(instruction_id_list, kwargs_list, strict=True))
    return IFEvalScoreData(
        instruction_id_list=tuple(instruction_id_list),
        prompt_level_strict_acc=all(strict),
        inst_level_strict_acc=strict,
        prompt_level_loose_acc=all(loose),
        inst_level_loose_acc=loose,
    )


def summarize_scores(scores: Iterable[IFEvalScoreData]) -> dict[str, float]:
    """Dataset-level IFEval metrics: prompt-level = mean over prompts; instruction-level = pooled over instructions."""
    scores = list(scores)
    if not scores:
        raise ValueError("summarize_scores needs at least one score")
    strict_flags = [flag for score in scores for flag in score.inst_level_strict_acc]
    loose_flags = [flag for score in scores for flag in score.inst_level_loose_acc]
    return {
        "prompt_level_strict_acc": _mean([score.prompt_level_strict_acc for score in scores]),
        "inst_level_strict_acc": _mean(strict_flags),
        "prompt_level_loose_acc": _mean([score.prompt_level_loose_acc for score in scores]),
        "inst_level_loose_acc": _mean(loose_flags),
    }
