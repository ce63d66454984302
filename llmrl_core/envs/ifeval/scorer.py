"""``IfEvalScorer``: scores each policy response against its row's IFEval instructions (a ChatEnv transform).

Semantics follow TorchRL 0.14.1's ``IfEvalScorer``:

* The scored text is the content of the first ``<answer>...</answer>`` block of the policy's last message
  (an empty string when there is none, which follows no instruction). ``answer_only=False`` scores the whole
  message instead, which is plain IFEval evaluation of a model that is not asked for tags.
* It is a TorchRL TensorDict transform: ``_step`` reads each row's answer from the step's action data and its
  ``instruction_id_list`` and ``kwargs`` (keys configurable) from the row's fields; the result is an
  :class:`~llmrl_core.envs.ifeval.evaluation.IFEvalScoreData` written, as TorchRL writes it, under
  ``("next", score_key)`` of the step's TensorDict (and of the collector's rows); a ChatEnv keeps it in
  ``slot.info[score_key]`` too (``Transform._note_row``). Unlike TorchRL's, it runs in every input mode.
* With ``aggregate_reward=True`` the step reward is :func:`~llmrl_core.envs.ifeval.reward.ifeval_reward`
  (weights ``format_weights``, default 0.4/0.3/0.2/0.1, plus 0.1/0.05 for exactly one answer/think block).
  A callable replaces it: ``fn(score, think_blocks=..., answer_blocks=..., complete=...) -> float``.
  ``aggregate_reward=False`` records the scores without adding a reward.
* The slots' ``reward_components`` get the four metrics (instruction-level ones as fractions) and the two format
  flags (noted for the env, as the step's TensorDict has no place for them).
* With ``set_done_if_answer`` the episode terminates once the response has an answer block.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase

from llmrl_core.data.tensor_specs import Composite, Unbounded
from llmrl_core.envs.ifeval.evaluation import IFEvalScoreData, score_response
from llmrl_core.envs.ifeval.reward import IFEVAL_WEIGHTS, extract_blocks, ifeval_reward, metric_components
from llmrl_core.envs.tensordict_io import (
    add_per_row,
    end_rows,
    responses_from_tensordict,
    stack_next_fields,
    step_flattened,
    step_row_fields,
)
from llmrl_core.envs.transforms.td_base import Transform
from llmrl_core.envs.types import Response

_LOG = logging.getLogger("llmrl_core.envs.ifeval")
RewardAggregator = Callable[..., float]
METRIC_NAMES: tuple[str, ...] = (
    "prompt_level_strict_acc",
    "inst_level_strict_acc",
    "prompt_level_loose_acc",
    "inst_level_loose_acc",
)


class IfEvalScorer(Transform):
    """Scores IFEval responses and turns the four metrics into a reward (see the module docstring).

    The keyword arguments are TorchRL's, in its order, then llmrl's ``answer_only``. ``prompt_key`` and
    ``response_column`` name TorchRL's prompt / response entries; here the response is always the slot's last
    policy message and the prompt is not scored, so both are only stored (as ``prompt_key`` / ``response_key``).
    ``verbose=True`` logs each slot's score and reward at INFO level on the ``llmrl_core.envs.ifeval`` logger.
    In a TensorDict step's ``"next"`` data the reward is ``(B, 1, 1)``, as TorchRL writes it (none without
    ``aggregate_reward``), beside the score under ``score_key``.
    """

    def __init__(
        self,
        *,
        instruction_ids_key: str = "instruction_id_list",
        prompt_key: str | tuple[str, ...] = "text",
        keyword_args_key: str = "kwargs",
        id_key: str = "key",
        response_column: str | tuple[str, ...] = "text_response",
        score_key: str = "ifeval_score",
        aggregate_reward: bool | RewardAggregator = True,
        format_weights: Sequence[float] | None = None,
        verbose: bool = False,
        set_done_if_answer: bool = True,
        answer_only: bool = True,
    ) -> None:
        super().__init__()
        weights = tuple(format_weights) if format_weights is not None else IFEVAL_WEIGHTS
        if len(weights) != 4:
            raise ValueError(f"format_weights must have 4 entries, got {weights}")
        self.instruction_ids_key = instruction_ids_key
        self.prompt_key = prompt_key
        self.response_key = response_column
        self.verbose = verbose
        self.keyword_args_key = keyword_args_key
        self.id_key = id_key
        self.score_key = score_key
        self.aggregate_reward = aggregate_reward
        self.format_weights = weights
        self.answer_only = answer_only
        self.set_done_if_answer = set_done_if_answer

    def _evaluate(
        self, text: str, instruction_id_list: Any, kwargs_list: Any
    ) -> tuple[IFEvalScoreData, list[str], list[str]]:
        """``(score, think_blocks, answer_blocks)`` for one policy message."""
        think_blocks = extract_blocks(text, "think")
        answer_blocks = extract_blocks(text, "answer")
        scored = (answer_blocks[0] if answer_blocks else "") if self.answer_only else text
        return score_response(instruction_id_list, kwargs_list, scored), think_blocks, answer_blocks

    def score_text(self, text: str, instruction_id_list: Any, kwargs_list: Any) -> tuple[IFEvalScoreData, float]:
        """Score one policy message against one row's instructions: ``(score, reward)`` (reward 0.0 when not
        aggregating). Useful outside an env, e.g. to evaluate saved responses."""
        score, think_blocks, answer_blocks = self._evaluate(text, instruction_id_list, kwargs_list)
        return score, self._reward(score, think_blocks, answer_blocks, complete=None)

    def _reward(
        self, score: IFEvalScoreData, think_blocks: list[str], answer_blocks: list[str], complete: bool | None
    ) -> float:
        if callable(self.aggregate_reward):
            return float(
                self.aggregate_reward(score, think_blocks=think_blocks, answer_blocks=answer_blocks, complete=complete)
            )
        if self.aggregate_reward:
            return ifeval_reward(score, think_blocks, answer_blocks, self.format_weights)
        return 0.0

    # --- the env hooks ---------------------------------------------------------------------------
    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        """Score each row's answer (the step's action data ``tensordict``) against its row's instructions; write
        the score under ``score_key`` and the reward ``(B, 1, 1)`` (added to one already there) into
        ``next_tensordict``, end answered episodes (see the module docstring). A row whose episode had ended
        before the step gets a zeroed score and no reward."""
        if step_flattened(self, tensordict, next_tensordict):
            return next_tensordict
        size = next_tensordict.batch_size[0]
        answers = responses_from_tensordict(tensordict, getattr(self.parent, "tokenizer", None))
        rows = step_row_fields(tensordict, next_tensordict)
        active = self._active_rows(size)
        scores: list[IFEvalScoreData | None] = [None] * size
        rewards = [0.0] * size
        answered = [False] * size
        for i in active:
            score, rewards[i], answered[i] = self._score_row(i, answers[i], rows[i])
            scores[i] = score
        stacked = stack_next_fields([{self.score_key: score} if score is not None else {} for score in scores])
        if self.score_key in stacked:
            next_tensordict.set(self.score_key, stacked[self.score_key])
        device = next_tensordict.device
        if self.aggregate_reward:
            value = torch.tensor(rewards, dtype=torch.float32, device=device).reshape(size, 1, 1)
            existing = next_tensordict.get("reward", None)
            next_tensordict.set(
                "reward", value if existing is None else add_per_row(existing, value, "IfEvalScorer", "reward")
            )
        if self.set_done_if_answer:
            end_rows(next_tensordict, answered)
        return next_tensordict

    def _score_row(self, index: int, answer: Response, row: dict[str, Any]) -> tuple[IFEvalScoreData, float, bool]:
        """``(score, reward, answered)`` of one row; its metrics, format flags and score are noted for the env."""
        where = f"slot {self._slot_of(index)} (prompt {row.get(self.id_key)!r})"
        missing = [k for k in (self.instruction_ids_key, self.keyword_args_key) if k not in row]
        if missing:
            raise ValueError(f"IfEvalScorer: {where} has no field(s) {missing}; row fields: {sorted(row)}")
        try:
            score, think_blocks, answer_blocks = self._evaluate(
                answer.text, row[self.instruction_ids_key], row[self.keyword_args_key]
            )
        except ValueError as err:
            raise type(err)(f"IfEvalScorer: prompt {row.get(self.id_key)!r}: {err}") from None
        components = dict(zip(METRIC_NAMES, metric_components(score), strict=True))
        components["answer_block"] = float(len(answer_blocks) == 1)
        components["think_block"] = float(len(think_blocks) == 1)
        complete = answer.finish_reason != "length"
        reward = self._reward(score, think_blocks, answer_blocks, complete=complete)
        self._note_row(index, reward_components=components, info={self.score_key: score})
        if self.verbose:
            _LOG.info("IfEvalScorer: %s: %s, reward %.4f", where, score, reward)
        return score, reward, bool(answer_blocks)

    def transform_reward_spec(self, reward_spec: Composite) -> Composite:
        """``reward`` of shape ``batch + (1, 1)`` when the scorer rewards (TorchRL's)."""
        if self.aggregate_reward:
            reward_spec["reward"] = Unbounded(shape=(*reward_spec.shape, 1, 1), device=reward_spec.device)
        return reward_spec

    def __repr__(self) -> str:
        return (
            f"IfEvalScorer(score_key={self.score_key!r}, format_weights={self.format_weights}, "
            f"answer_only={self.answer_only}, set_done_if_answer={self.set_done_if_answer})"
        )
