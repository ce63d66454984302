"""``IFEvalEnv``: the IFEval prompts as a :class:`~llmrl_core.envs.dataset_chat_env.DatasetChatEnv`, scored by
:class:`~llmrl_core.envs.ifeval.scorer.IfEvalScorer`.

Prompt design: like TorchRL's ``IFEvalEnv`` the policy is asked to reason in ``<think>`` and to put its
response in ``<answer>``, and only the answer block is scored. Small instruct models ignore format
instructions given only in the system prompt (measured on SmolLM2-135M, see STACK.md), so the request is
also followed by a short format line in the user turn (``question_template``); it shows the tags but no
example content that could be copied. The request text itself is unchanged, so ``combination:repeat_prompt``
(whose kwarg holds the request) still applies. For plain IFEval evaluation of a model that is not asked
for tags, pass ``system_prompt=None, question_template=None, answer_only=False``.

Every row is checked when the env is built (fields, instruction ids, kwargs), so a bad row fails at once
with its source, row number and key instead of in the middle of a rollout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from llmrl_core.builtin_data.ifeval_data import check_ifeval_row, load_ifeval
from llmrl_core.envs.chat_env import InputMode
from llmrl_core.envs.dataset_chat_env import DatasetChatEnv
from llmrl_core.envs.gsm8k import GSM8KPrepareQuestion
from llmrl_core.envs.ifeval.registry import validate_instructions
from llmrl_core.envs.ifeval.scorer import IfEvalScorer

IFEVAL_SYSTEM_PROMPT = (
    "You follow instructions precisely. Reason inside <think> and </think>, then write your complete response "
    "inside <answer> and </answer>. Only the answer block is checked: it must meet every requirement of the "
    "request, such as length, format, case, punctuation and required or forbidden words."
)
IFEVAL_QUESTION_TEMPLATE = (
    "{question}\n\nThink inside <think></think>, then write your whole response inside <answer></answer>."
)


class IFEvalPrepareQuestion(GSM8KPrepareQuestion):
    """Appends the format line to the user request at reset (``template`` must contain ``{question}``)."""

    def __init__(self, template: str = IFEVAL_QUESTION_TEMPLATE, role: str = "user") -> None:
        super().__init__(template=template, role=role)


class IFEvalEnv(DatasetChatEnv):
    """IFEval as a chat env: rows ``{key, prompt, instruction_id_list, kwargs}`` from ``dataset`` (default: the
    541 shipped prompts; also a jsonl/parquet path, a ``datasets.Dataset`` such as ``google/IFEval``, or a list
    of dicts), one turn, rewarded by :class:`IfEvalScorer`. ``batch_size``/``repeats``/``group_repeats``/
    ``shuffle``/``seed`` drive the :class:`~llmrl_core.envs.primer.DataLoadingPrimer` as in ``DatasetChatEnv``.
    """

    def __init__(
        self,
        dataset: Any = "google/IFeval",
        *,
        batch_size: int | None = None,
        repeats: int | None = None,
        group_repeats: bool = False,
        shuffle: bool = True,
        seed: int | None = None,
        tokenizer: Any = None,
        input_mode: InputMode = "history",
        system_prompt: str | None = IFEVAL_SYSTEM_PROMPT,
        question_template: str | None = IFEVAL_QUESTION_TEMPLATE,
        compute_reward: bool = True,
        format_weights: Sequence[float] | None = None,
        answer_only: bool = True,
        set_done_if_answer: bool = True,
        max_turns: int | None = None,
        template_kwargs: dict[str, Any] | None = None,
        chat_template_name: str | None = None,
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
        super().__init__(
            dataset if dataset not in (None, "google/IFeval", "google/IFEval") else load_ifeval(),
            batch_size=batch_size,
            repeats=repeats,
            group_repeats=group_repeats,
            shuffle=shuffle,
            seed=seed,
            data_key="query",
            rename={"prompt": "query"},
            id_key="key",
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
        self._validate_rows()
        if question_template is not None:
            self.append_transform(IFEvalPrepareQuestion(question_template, role=self.user_role))
        self.scorer: IfEvalScorer | None = None
        if compute_reward:
            self.scorer = IfEvalScorer(
                format_weights=format_weights, answer_only=answer_only, set_done_if_answer=set_done_if_answer
            )
            self.append_transform(self.scorer)

    def _validate_rows(self) -> None:
        """Check every source row up front; errors name the source, the row number and the row's key."""
        source = self.primer.source
        for index in range(len(source)):
            row = source[index]
            where = f"{source.name}: row {index}"
            checked = check_ifeval_row(row, where)
            where = f"{where} (key {checked['key']})"
            validate_instructions(checked["instruction_id_list"], checked["kwargs"], where=where)
