"""GSM8K: ``GSM8KPrepareQuestion``, ``GSM8KEnv`` and the ``make_gsm8k_env`` builder.

Prompt design: the format instruction goes into the user turn after the question (``GSM8KPrepareQuestion``)
as well as the system prompt, because small instruct models ignore format instructions that only appear in
the system prompt (measured on SmolLM2-135M, see STACK.md). The instruction shows the tags but no literal
answer, so the format bonus cannot be earned by copying an example number.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase

from llmrl_core.builtin_data import gsm8k_path
from llmrl_core.data.conversation import Conversation
from llmrl_core.envs.chat_env import InputMode
from llmrl_core.envs.dataset_chat_env import DatasetChatEnv
from llmrl_core.envs.gsm8k_reward import GSM8KRewardParser
from llmrl_core.envs.transforms.few_shot import FewShotExamples
from llmrl_core.envs.transforms.td_base import Transform

GSM8K_SYSTEM_PROMPT = (
    "You solve grade-school math word problems. Reason step by step inside <think> and </think>, "
    "then write only the final number inside <answer> and </answer>."
)
GSM8K_QUESTION_TEMPLATE = (
    "{question}\n\nThink inside <think></think>, then put only the final number inside <answer></answer>."
)


def _text_keys(keys: Sequence[Any] | None, name: str) -> list[str]:
    """TorchRL's default key list ``["text"]``; any other key list raises ``ValueError``."""
    if keys is None:
        return ["text"]
    keys = [keys] if isinstance(keys, (str, tuple)) else list(keys)
    if keys != ["text"]:
        raise ValueError(
            f"GSM8KPrepareQuestion: {name}={keys!r} is not supported; llmrl rewrites the last user message, "
            "which matches TorchRL's default ['text'] (pass None or ['text'])"
        )
    return keys


class GSM8KPrepareQuestion(Transform):
    """Rewrites the user question at reset with a format instruction (``template`` with ``{question}``), as
    TorchRL's TensorDict transform of the same name: its ``_reset`` rewrites the last ``role`` message of each row's
    ``("history", "prompt")``, which the env then takes as the conversation (its text or ids follow in the text
    and tokens modes). Steps pass through unchanged.

    ``in_keys`` / ``out_keys`` come first as in TorchRL, where they name the text entries rewritten at reset.
    Here the question is always the last ``role`` message of the new conversation, so only TorchRL's default
    (None, or ``["text"]`` read and written in place) is accepted; other keys raise ``ValueError``.
    """

    def __init__(
        self,
        in_keys: Sequence[Any] | None = None,
        out_keys: Sequence[Any] | None = None,
        *,
        template: str = GSM8K_QUESTION_TEMPLATE,
        role: str = "user",
    ) -> None:
        in_keys = _text_keys(in_keys, "in_keys")
        out_keys = in_keys if out_keys is None else _text_keys(out_keys, "out_keys")
        if out_keys != in_keys:
            raise ValueError("GSM8KPrepareQuestion: out_keys must equal in_keys (the text is rewritten in place)")
        if "{question}" not in template:
            raise ValueError("GSM8KPrepareQuestion template must contain '{question}'")
        super().__init__(in_keys=in_keys, out_keys=out_keys)
        self.template = template
        self.role = role

    def prepare(self, conversation: Conversation, row: int) -> Conversation:
        """``conversation`` with its last ``role`` message formatted by the template."""
        messages = list(conversation.messages)
        last = max((i for i, m in enumerate(messages) if m.role == self.role), default=None)
        if last is None:
            raise ValueError(f"GSM8KPrepareQuestion: row {row} has no {self.role!r} message to prepare")
        messages[last] = dataclasses.replace(messages[last], content=self.template.format(question=messages[last].text))
        return Conversation(messages)

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        """Format each new conversation's question (``("history", "prompt")`` of the reset data; on a partial reset,
        the rows ``tensordict["_reset"]`` marks)."""
        return self._rewrite_reset_prompts(tensordict, tensordict_reset, self.prepare)

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        """Steps are left as they are (the question is prepared once, at reset)."""
        return next_tensordict

    def __repr__(self) -> str:
        return f"GSM8KPrepareQuestion(role={self.role!r})"


class GSM8KEnv(DatasetChatEnv):
    """GSM8K as a DatasetChatEnv: prompts from ``dataset`` (default: the shipped train split), rows with
    ``question`` and ``answer`` fields, the question prepared with a format instruction, rewards from
    :class:`GSM8KRewardParser`; one turn by default. ``few_shot`` (``{"question", "response" | "turns"}`` mappings)
    adds worked examples as earlier turns (:class:`FewShotExamples`), their questions under the same template."""

    def __init__(
        self,
        dataset: Any = "openai/gsm8k",
        *,
        batch_size: int | None = None,
        repeats: int | None = None,
        group_repeats: bool = False,
        shuffle: bool = True,
        seed: int | None = None,
        tokenizer: Any = None,
        input_mode: InputMode = "history",
        system_prompt: str | None = GSM8K_SYSTEM_PROMPT,
        question_template: str | None = GSM8K_QUESTION_TEMPLATE,
        compute_reward: bool = True,
        max_turns: int | None = None,
        template_kwargs: dict[str, Any] | None = None,
        chat_template_name: str | None = None,
        format_reward: float = 0.1,
        correct_reward: float = 1.0,
        few_shot: Sequence[Mapping[str, Any]] = (),
        max_steps: int = 1,
        num_envs: int = 1,
        batch_size_dl: int = 1,
        device: torch.device | str | None = None,
        apply_template: bool | None = False,
        collate_fn: Callable[[Any], Any] | None = None,
        ray_backend: bool = False,
        dataloader_actor_name: str | None = None,
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
            max_turns=max_turns if max_turns is not None else max_steps,
            num_envs=num_envs,
            batch_size_dl=batch_size_dl,
            device=device,
            apply_template=apply_template,
            collate_fn=collate_fn,
            ray_backend=ray_backend,
            dataloader_actor_name=dataloader_actor_name,
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
            self.append_transform(GSM8KPrepareQuestion(template=question_template, role=self.user_role))
        if compute_reward:
            self.append_transform(
                GSM8KRewardParser(tokenizer=tokenizer, format_reward=format_reward, correct_reward=correct_reward)
            )


def make_gsm8k_env(
    dataset: Any = "openai/gsm8k",
    num_envs: int = 1,
    repeats: int | None = None,
    batch_size_dl: int = 1,
    seed: int | None = None,
    group_repeats: bool = False,
    tokenizer: Any = None,
    *,
    split: str = "train",
    batch_size: int | None = None,
    input_mode: InputMode = "history",
    **kwargs: Any,
) -> GSM8KEnv:
    """Build a :class:`GSM8KEnv` (TorchRL's arguments and defaults first).

    ``dataset`` may be a path, a ``datasets.Dataset`` or rows; None or TorchRL's default hub id
    ``"openai/gsm8k"`` means the copy shipped with llmrl (nothing is downloaded), its ``split`` (``train`` or
    ``test``). ``seed=None`` (TorchRL's default) draws a random prompt order; pass an int to reproduce one.
    """
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
