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
from typing import Any

import torch
from tensordict import LazyStackedTensorDict, TensorClass

from llmrl_core.envs.ifeval.registry import check_instruction, validate_instructions


class IFEvalScoreData(TensorClass):
    """The IFEval result of one response to one prompt, as TorchRL's tensorclass of the same name: the four metrics as
    bool tensors, ``prompt_level_*_acc`` of shape ``batch_size + (1,)``, ``inst_level_*_acc`` one entry per
    instruction (``batch_size + (n,)``), so a TorchRL reward aggregator's tensor arithmetic runs on it
    (``score.inst_level_strict_acc.float().mean(-1)``).

    Built from tensors or plain Python (bools, lists of bools); a missing metric is ``zeros(batch_size + (1,))``,
    as TorchRL fills it. llmrl adds ``instruction_id_list`` (the instructions the flags belong to, keyword or fifth
    argument), ``*_fraction`` (a single score's instruction-level means as floats) and :meth:`to_plain`.
    """

    prompt_level_strict_acc: torch.Tensor | None = None
    inst_level_strict_acc: torch.Tensor | None = None
    prompt_level_loose_acc: torch.Tensor | None = None
    inst_level_loose_acc: torch.Tensor | None = None
    instruction_id_list: list[str] | None = None

    def __post_init__(self) -> None:
        stacked = isinstance(self._tensordict, LazyStackedTensorDict)  # a stack of scores of unequal lengths
        for name in _METRICS:
            if stacked:  # read padded, as TorchRL does; only a missing or flat metric is rewritten
                value = self.get(name, as_padded_tensor=True) if name in self._tensordict.keys() else None
                if value is None:
                    setattr(self, name, torch.zeros(self.batch_size + (1,), dtype=torch.bool))
                elif value.ndim == self.ndim:
                    setattr(self, name, value.unsqueeze(-1))
                continue
            value = getattr(self, name)
            if value is None:
                value = torch.zeros(self.batch_size + (1,), dtype=torch.bool)
            elif not isinstance(value, torch.Tensor):  # plain flags; a tensor keeps its dtype (``score.to(float)``)
                value = torch.as_tensor(value, dtype=torch.bool)
            if value.ndim == self.ndim:  # one flag per row: TorchRL keeps a trailing dimension of 1
                value = value.unsqueeze(-1)
            setattr(self, name, value)

    @property
    def inst_level_strict_fraction(self) -> float:
        """Fraction of this prompt's instructions followed strictly (0.0 when there are none)."""
        return _mean(self.inst_level_strict_acc.tolist())

    @property
    def inst_level_loose_fraction(self) -> float:
        """Fraction of this prompt's instructions followed loosely (0.0 when there are none)."""
        return _mean(self.inst_level_loose_acc.tolist())

    def to_plain(self) -> dict[str, Any]:
        """One score as plain Python (bools and lists of bools), e.g. for JSON or a Parquet column."""
        out: dict[str, Any] = {"instruction_id_list": list(self.instruction_id_list or [])}
        for name in _METRICS:
            flags = getattr(self, name).tolist()
            out[name] = bool(flags[0]) if name.startswith("prompt_level") else flags
        return out


_METRICS = ("prompt_level_strict_acc", "inst_level_strict_acc", "prompt_level_loose_acc", "inst_level_loose_acc")


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
        prompt_level_strict_acc=all(strict),
        inst_level_strict_acc=list(strict),
        prompt_level_loose_acc=all(loose),
        inst_level_loose_acc=list(loose),
        instruction_id_list=list(instruction_id_list),
        batch_size=(),
    )


def summarize_scores(scores: Iterable[IFEvalScoreData]) -> dict[str, float]:
    """Dataset-level IFEval metrics: prompt-level = mean over prompts; instruction-level = pooled over instructions."""
    scores = list(scores)
    if not scores:
        raise ValueError("summarize_scores needs at least one score")
    plain = [score.to_plain() for score in scores]
    return {
        name: _mean(
            [s[name] for s in plain] if name.startswith("prompt_level") else [f for s in plain for f in s[name]]
        )
        for name in _METRICS
    }
