"""GSM8K: ``GSM8KPrepareQuestion``, ``GSM8KEnv`` and the ``make_gsm8k_env`` builder.

Prompt design: the format instruction goes into the user turn after the question (``GSM8KPrepareQuestion``)
as well as the system prompt, because small instruct models ignore format instructions that only appear in
the system prompt (measured on SmolLM2-135M, see STACK.md). The instruction shows the tags but no literal
answer, so the format bonus cannot be earned by copying an example number.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from llmrl_core.builtin_data import gsm8k_path
from llmrl_core.envs.chat_env import InputMode
from llmrl_core.envs.dataset_chat_env import DatasetChatEnv
from llmrl_core.envs.gsm8k_reward import GSM8KRewardParser
from llmrl_core.envs.transforms.base import Transform
from llmrl_core.envs.transforms.few_shot import FewShotExamples
from llmrl_core.envs.types import SlotState

GSM8K_SYSTEM_PROMPT = (
    "You solve grade-school math word problems. Reason step by step inside <think> and </think>, "
    "then write only the final number inside <answer> and </answer>."
)
GSM8K_QUESTION_TEMPLATE = (
    "{question}\n\nThink inside <think></think>, then put only the final number inside <answer></answer>."
)


class GSM8KPrepareQuestion(Transform):
    """Rewrites the user question at reset with a format instruction (``template`` with ``{question}``)."""

    def __init__(self, template: str = GSM8K_QUESTION_TEMPLATE, role: str = "user") -> None:
        super().__init__()
        if "{question}" not in template:
            raise ValueError("GSM8KPrepareQuestion template must contain '{question}'")
        self.template = template
        self.role = role

    def reset_slot(self, slot: SlotState) -> None:
        """Format the last ``role`` message of the new conversation."""
        message = slot.last_message(self.role)
        if message is None:
            raise ValueError(f"slot {slot.index}: no {self.role!r} message to prepare")
        message.content = self.template.format(question=message.text)


class GSM8KEnv(DatasetChatEnv):
    """GSM8K as a DatasetChatEnv: prompts from ``dataset`` (default: the shipped train split), rows with
    ``question`` and ``answer`` fields, the question prepared with a format instruction, rewards from
    :class:`GSM8KRewardParser`; one turn by default. ``few_shot`` (``{"question", "response" | "turns"}`` mappings)
    adds worked examples as earlier turns (:class:`FewShotExamples`), their questions under the same template."""

    def __init__(
        self,
        dataset: Any = None,
        *,
        batch_size: int | None = None,
        repeats: int | None = None,
        group_repeats: bool = False,
        shuffle: bool = True,
        seed: int | None = 0,
        tokenizer: Any = None,
        input_mode: InputMode = "history",
        system_prompt: str | None = GSM8K_SYSTEM_PROMPT,
        question_template: str | None = GSM8K_QUESTION_TEMPLATE,
        compute_reward: bool = True,
        max_turns: int | None = 1,
        template_kwargs: dict[str, Any] | None = None,
        chat_template_name: str | None = None,
        format_reward: float = 0.1,
        correct_reward: float = 1.0,
        few_shot: Sequence[Mapping[str, Any]] = (),
        max_steps: int | None = None,
        **torchrl_kwargs: Any,
    ) -> None:
        if dataset == "openai/gsm8k":  # TorchRL's default hub id: the copy shipped in the package (offline)
            dataset = None
        super().__init__(
            dataset if dataset is not None else gsm8k_path("train"),
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
            template_kwargs=template_kwargs,
            chat_template_name=chat_template_name,
            max_turns=max_steps if max_steps is not None else max_turns,
            **torchrl_kwargs,
        )
        if few_shot:
            # example questions get the same template as the real one, so the examples look like the task
            shots = [
                {
                    "question": question_template.format(question=e.get("question", ""))
                    if question_template and e.get("question")
                    else e.get("question", ""),
                    **{k: v for k, v in e.items() if k != "question"},
                }
                for e in few_shot
            ]
            self.append_transform(FewShotExamples(shots, user_role=self.user_role))
        if question_template is not None:
            self.append_transform(GSM8KPrepareQuestion(question_template, role=self.user_role))
        if compute_reward:
            self.append_transform(
                GSM8KRewardParser(tokenizer=tokenizer, format_reward=format_reward, correct_reward=correct_reward)
            )


def make_gsm8k_env(
    dataset: Any = None,
    num_envs: int = 1,
    repeats: int | None = None,
    batch_size_dl: int = 1,
    seed: int | None = 0,
    group_repeats: bool = False,
    tokenizer: Any = None,
    *,
    split: str = "train",
    batch_size: int | None = None,
    input_mode: InputMode = "history",
    **kwargs: Any,
) -> GSM8KEnv:
    """Build a :class:`GSM8KEnv`; ``dataset`` may be a path, a ``datasets.Dataset`` or rows, else the shipped
    ``split`` (``train`` or ``test``) is used."""
    if dataset is None or dataset == "openai/gsm8k":
        dataset = gsm8k_path(split)
    elif isinstance(dataset, str) and not Path(dataset).exists():
        raise FileNotFoundError(f"GSM8K dataset {dataset} not found (pass a jsonl/parquet path or a Dataset)")
    return GSM8KEnv(
        dataset,
        num_envs=num_envs,
        batch_size_dl=batch_size_dl,
        batch_size=batch_size,
        repeats=repeats,
        group_repeats=group_repeats,
        seed=seed,
        tokenizer=tokenizer,
        input_mode=input_mode,
        **kwargs,
    )
