"""``IfEvalScorer``: scores each policy response against its row's IFEval instructions (a ChatEnv transform).

Semantics follow TorchRL 0.14.1's ``IfEvalScorer``:

* The scored text is the content of the first ``<answer>...</answer>`` block of the policy's last message
  (an empty string when there is none, which follows no instruction). ``answer_only=False`` scores the whole
  message instead, which is plain IFEval evaluation of a model that is not asked for tags.
* The row's ``instruction_id_list`` and ``kwargs`` (keys configurable) give the instructions; the result is
  an :class:`~llmrl_core.envs.ifeval.evaluation.IFEvalScoreData` stored in ``slot.info[score_key]`` and, as
  TorchRL writes it, under ``("next", score_key)`` of the step's TensorDict (and of the collector's rows).
* With ``aggregate_reward=True`` the step reward is :func:`~llmrl_core.envs.ifeval.reward.ifeval_reward`
  (weights ``format_weights``, default 0.4/0.3/0.2/0.1, plus 0.1/0.05 for exactly one answer/think block).
  A callable replaces it: ``fn(score, think_blocks=..., answer_blocks=..., complete=...) -> float``.
  ``aggregate_reward=False`` records the scores without adding a reward.
* ``reward_components`` get the four metrics (instruction-level ones as fractions) and the two format flags.
* With ``set_done_if_answer`` the episode terminates once the response has an answer block.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from llmrl_core.envs.ifeval.evaluation import IFEvalScoreData, score_response
from llmrl_core.envs.ifeval.reward import IFEVAL_WEIGHTS, extract_blocks, ifeval_reward, metric_components
from llmrl_core.envs.transforms.base import SlotTransform
from llmrl_core.envs.types import SlotState

_LOG = logging.getLogger("llmrl_core.envs.ifeval")
RewardAggregator = Callable[..., float]
METRIC_NAMES: tuple[str, ...] = (
    "prompt_level_strict_acc",
    "inst_level_strict_acc",
    "prompt_level_loose_acc",
    "inst_level_loose_acc",
)


class IfEvalScorer(SlotTransform):
    """Scores IFEval responses and turns the four metrics into a reward (see the module docstring).

    The keyword arguments are TorchRL's, in its order, then llmrl's ``answer_only``. ``prompt_key`` and
    ``response_column`` name TorchRL's prompt / response entries; here the response is always the slot's last
    policy message and the prompt is not scored, so both are only stored (as ``prompt_key`` / ``response_key``).
    ``verbose=True`` logs each slot's score and reward at INFO level on the ``llmrl_core.envs.ifeval`` logger.
    In a TensorDict step's ``"next"`` data the reward is ``(B, 1, 1)``, as TorchRL writes it (none without
    ``aggregate_reward``), beside the score under ``score_key``.
    """

    reward_shape = (1, 1)

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
        self.writes_reward = bool(aggregate_reward)
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

    def _instructions(self, slot: SlotState) -> tuple[Any, Any]:
        missing = [k for k in (self.instruction_ids_key, self.keyword_args_key) if k not in slot.data]
        if missing:
            raise ValueError(
                f"IfEvalScorer: slot {slot.index} (prompt {slot.data.get(self.id_key, slot.prompt_id)!r}) has no "
                f"field(s) {missing}; row fields: {sorted(slot.data)}"
            )
        return slot.data[self.instruction_ids_key], slot.data[self.keyword_args_key]

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

    def step_slot(self, slot: SlotState) -> None:
        """Score the slot's last policy message, record the metrics, add the reward, maybe terminate."""
        role = self.parent.policy_role if self.parent is not None else "assistant"
        message = slot.last_message(role)
        if message is None:
            raise ValueError(f"IfEvalScorer: slot {slot.index} has no {role!r} message to score")
        instruction_ids, kwargs_list = self._instructions(slot)
        try:
            score, think_blocks, answer_blocks = self._evaluate(message.text, instruction_ids, kwargs_list)
        except ValueError as err:
            where = f"prompt {slot.data.get(self.id_key, slot.prompt_id)!r}"
            raise type(err)(f"IfEvalScorer: {where}: {err}") from None
        slot.info[self.score_key] = score
        slot.next_fields[self.score_key] = score  # TorchRL writes it in the step's "next" data
        for name, value in zip(METRIC_NAMES, metric_components(score), strict=True):
            slot.reward_components[name] = value
        slot.reward_components["answer_block"] = float(len(answer_blocks) == 1)
        slot.reward_components["think_block"] = float(len(think_blocks) == 1)
        reward = self._reward(score, think_blocks, answer_blocks, complete=message.is_complete)
        if self.aggregate_reward:
            slot.add_reward(reward)
        if self.verbose:
            _LOG.info("IfEvalScorer: slot %d prompt %r: %s, reward %.4f", slot.index, slot.prompt_id, score, reward)
        if self.set_done_if_answer and answer_blocks:
            slot.terminate()

    def __repr__(self) -> str:
        return (
            f"IfEvalScorer(score_key={self.score_key!r}, format_weights={self.format_weights}, "
            f"answer_only={self.answer_only}, set_done_if_answer={self.set_done_if_answer})"
        )
