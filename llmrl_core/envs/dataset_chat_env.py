"""``DatasetChatEnv``: a :class:`~llmrl_core.envs.chat_env.ChatEnv` fed by a :class:`DataLoadingPrimer`.

``reset()`` with no arguments draws the next batch of prompts (``batch_size`` prompts x ``repeats`` copies
when ``group_repeats``), so a rollout loop only calls ``reset()`` / ``step(responses)``. The primer is the
first transform; its cursor is part of ``env.state_dict()`` for resuming.
"""

from __future__ import annotations

from typing import Any

from llmrl_core.envs.chat_env import ChatEnv, InputMode
from llmrl_core.envs.primer import DataLoadingPrimer


class DatasetChatEnv(ChatEnv):
    """A ChatEnv whose prompts come from a dataset (HF ``Dataset``, jsonl/parquet path or iterable of dicts)."""

    def __init__(
        self,
        dataset: Any,
        *,
        batch_size: int = 1,
        repeats: int = 1,
        group_repeats: bool = True,
        shuffle: bool = True,
        seed: int = 0,
        data_key: str = "query",
        rename: dict[str, str] | None = None,
        id_key: str | None = "id",
        system_prompt: str | None = None,
        tokenizer: Any = None,
        input_mode: InputMode = "history",
        template_kwargs: dict[str, Any] | None = None,
        chat_template_name: str | None = None,
        max_turns: int | None = 1,
        primer: DataLoadingPrimer | None = None,
    ) -> None:
        super().__init__(
            system_prompt=system_prompt,
            tokenizer=tokenizer,
            input_mode=input_mode,
            template_kwargs=template_kwargs,
            chat_template_name=chat_template_name,
            data_key=data_key,
            max_turns=max_turns,
        )
        self.primer = primer or DataLoadingPrimer(
            dataset,
            batch_size=batch_size,
            repeats=repeats,
            group_repeats=group_repeats,
            shuffle=shuffle,
            seed=seed,
            rename=rename,
            id_key=id_key,
        )
        self.append_transform(self.primer)

    def reset_dataloader(self, seed: int | None = None) -> None:
        """Restart the prompt stream from the beginning (see ``DataLoadingPrimer.reset_dataloader``)."""
        self.primer.reset_dataloader(seed)
