"""``ReasoningGymEnv``: any `reasoning-gym` dataset as a single-turn chat env, scored by the dataset itself.

The prompt is the dataset's question (optionally under a ``question_template``) after a system prompt asking for
the final answer inside ``<answer></answer>``; the reward is the dataset's own ``score_answer`` of the answer tag's
content (:class:`ReasoningGymReward`). Rows come from :mod:`llmrl_core.builtin_data.reasoning_gym_data`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llmrl_core.builtin_data.reasoning_gym_data import ReasoningGymRows, ReasoningGymSpec, score_entry
from llmrl_core.envs.chat_env import InputMode
from llmrl_core.envs.dataset_chat_env import DatasetChatEnv
from llmrl_core.envs.gsm8k import GSM8KPrepareQuestion
from llmrl_core.envs.gsm8k_reward import GSM8KRewardParser, extract_tags
from llmrl_core.envs.transforms.few_shot import FewShotExamples

REASONING_GYM_SYSTEM_PROMPT = (
    "Solve the task. You may reason briefly inside <think> and </think>; then write only the final answer "
    "inside <answer> and </answer>, in the form the task asks for."
)


class ReasoningGymReward(GSM8KRewardParser):
    """Pays the dataset's ``score_answer`` (in [0, 1], times ``correct_reward``) for the answer tag's content;
    ``format_reward`` when an answer was given and scored lower; 0 without an answer tag.
    ``info["success"]`` is a full score."""

    def __init__(self, spec: ReasoningGymSpec, tokenizer: Any = None, **kwargs: Any) -> None:
        super().__init__(tokenizer=tokenizer, **kwargs)
        self.spec = spec

    def score_row(self, response: str, row: Mapping[str, Any]) -> dict[str, float | bool]:
        """The reward outputs of one response to one reasoning-gym row."""
        think, answer = extract_tags(self.strip_end(response))
        has_answer = bool(answer)
        score = score_entry(self.spec, row, answer) if has_answer else 0.0
        right = max(score * self.correct_reward, self.format_reward) if has_answer else 0.0
        return {
            "reward_answer": float(has_answer),
            "reward_think": float(bool(think)),
            "reward_right": right,
            "reward": right,
            "success": has_answer and score >= 1.0,
        }


class ReasoningGymEnv(DatasetChatEnv):
    """A reasoning-gym dataset (``dataset``: its name, ``config``: its settings) as a :class:`DatasetChatEnv`:
    prompts from the ``split`` rows (disjoint seeds for train and test), rewards from the dataset's own scorer;
    ``few_shot`` worked examples come before the question as earlier turns."""

    def __init__(
        self,
        dataset: str,
        *,
        config: Mapping[str, Any] | None = None,
        seed: int = 0,
        size: int | None = None,
        test_size: int | None = None,
        split: str = "train",
        batch_size: int | None = None,
        repeats: int | None = None,
        group_repeats: bool = False,
        shuffle: bool = True,
        tokenizer: Any = None,
        input_mode: InputMode = "history",
        system_prompt: str | None = REASONING_GYM_SYSTEM_PROMPT,
        question_template: str | None = None,
        format_reward: float = 0.0,
        correct_reward: float = 1.0,
        few_shot: Sequence[Mapping[str, Any]] = (),
        max_turns: int | None = 1,
        **kwargs: Any,
    ) -> None:
        options = {"dataset": dataset, "config": dict(config or {}), "seed": seed, "size": size, "test_size": test_size}
        self.spec = ReasoningGymSpec.from_options(options, "ReasoningGymEnv")
        self.spec.validate("ReasoningGymEnv")
        super().__init__(
            ReasoningGymRows(self.spec, split),
            batch_size=batch_size,
            repeats=repeats,
            group_repeats=group_repeats,
            shuffle=shuffle,
            seed=seed,
            data_key="query",
            rename={"question": "query"},
            system_prompt=system_prompt,
            tokenizer=tokenizer,
            input_mode=input_mode,
            max_turns=max_turns,
            **kwargs,
        )
        if few_shot:  # worked examples as earlier turns (``{question, response | turns}``), as in GSM8KEnv
            self.append_transform(FewShotExamples(list(few_shot), user_role=self.user_role))
        if question_template is not None:
            self.append_transform(GSM8KPrepareQuestion(template=question_template, role=self.user_role))
        self.append_transform(
            ReasoningGymReward(
                self.spec, tokenizer=tokenizer, format_reward=format_reward, correct_reward=correct_reward
            )
        )
