"""Where the prompts of a reset of :class:`~llmrl_core.envs.chat_env.ChatEnv` come from (:class:`PromptRows`, one of
its base classes): the prompts given, the rows a primer supplied for a partial reset that no slot took yet, or the
next batch of the env's prompt source (a transform's ``provide_prompts``, e.g. the ``DataLoadingPrimer``); each
becomes a :class:`~llmrl_core.envs.types.PromptRow` and then a new slot's conversation. ``set_seed`` seeds the
prompt order."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

from llmrl_core.data.conversation import Conversation, Message
from llmrl_core.envs.env_inputs import ChatEnvInputError
from llmrl_core.envs.types import PromptRow, SlotState


class PromptRows:
    """The env's prompt rows and the slots made from them; the env sets ``td_transforms``, ``num_slots``,
    ``slots``, ``data_key``, ``system_prompt``, ``system_role``, ``user_role``, ``_pending_rows`` and ``_seed``."""

    td_transforms: list[Any]
    num_slots: int | None
    slots: list[SlotState]
    data_key: str
    system_prompt: str | None
    system_role: str
    user_role: str
    _pending_rows: list[PromptRow]
    _seed: int | None

    def set_seed(self, seed: int | None = None) -> int:
        """Seed the prompt order: every primer restarts its stream in the order of ``seed``; returns the seed.

        Transforms with their own ``set_seed(seed)`` get it too. Rows drawn for a partial reset but not used
        yet are dropped (they came from the old order). ``None`` picks a random seed. (TorchRL's
        ``set_seed`` returns a derived seed for a sibling env; this returns the seed itself.)
        """
        from llmrl_core.envs.primer import DataLoadingPrimer

        seed = secrets.randbits(31) if seed is None else int(seed)
        self._pending_rows = []
        for transform in self.td_transforms:
            set_seed = getattr(transform, "set_seed", None)
            if callable(set_seed):
                set_seed(seed)
            elif isinstance(transform, DataLoadingPrimer):
                transform.reset_dataloader(seed)
        self._seed = seed
        return seed

    def _provided_rows(self, caller: str) -> list[Any]:
        """The next batch of the env's prompt source: the first transform (e.g. the
        ``DataLoadingPrimer``) whose ``provide_prompts`` answers."""
        for transform in self.td_transforms:
            provide = getattr(transform, "provide_prompts", None)
            provided = provide(self.num_slots) if callable(provide) else None
            if provided is not None:
                return list(provided)
        raise ChatEnvInputError(f"{caller} got no prompts and no transform provides them (add a DataLoadingPrimer)")

    def _draw_rows(self, n: int, caller: str) -> list[PromptRow]:
        """``n`` rows from the pending ones first, then from the primer, batch by batch."""
        while len(self._pending_rows) < n:
            provided = self._provided_rows(caller)
            if not provided:
                raise ValueError(f"{caller}: the primer supplied an empty batch")
            self._pending_rows.extend(self._as_row(item, i) for i, item in enumerate(provided))
        rows, self._pending_rows = self._pending_rows[:n], self._pending_rows[n:]
        return rows

    def _collect_prompts(self, prompts: Sequence[Any] | None) -> list[PromptRow]:
        if prompts is None and self._pending_rows:
            # Rows left over from a partial reset come first, so none is skipped.
            prompts = self._draw_rows(self.num_slots or len(self.slots) or len(self._pending_rows), "reset()")
        if prompts is None:
            prompts = self._provided_rows("reset()")
        if isinstance(prompts, str | Conversation | dict | PromptRow):
            prompts = [prompts]
        rows = [self._as_row(item, i) for i, item in enumerate(prompts)]
        if not rows:
            raise ValueError("reset() got an empty batch of prompts")
        if self.num_slots is not None and len(rows) != self.num_slots:
            raise ValueError(f"reset() got {len(rows)} prompts but the env's batch_size is {self.num_slots}")
        return rows

    def _as_row(self, item: Any, index: int) -> PromptRow:
        if isinstance(item, PromptRow):
            return item
        if isinstance(item, dict) and not ("role" in item and "content" in item):
            if self.data_key not in item:
                raise ValueError(f"prompt {index}: row has no {self.data_key!r} field (fields: {sorted(item)})")
            return PromptRow(data=dict(item), prompt_id=item.get("id", index))
        return PromptRow(data={self.data_key: item}, prompt_id=index)

    def _make_slot(self, index: int, row: PromptRow) -> SlotState:
        query = row.data.get(self.data_key)
        if query is None:
            raise ValueError(f"prompt {index} (id {row.prompt_id!r}): missing {self.data_key!r}")
        if isinstance(query, str):
            history = Conversation([Message(self.user_role, query)])
        elif isinstance(query, Conversation):
            history = query.copy()
        elif isinstance(query, list | tuple):
            history = Conversation(list(query))
        else:
            raise TypeError(
                f"prompt {index}: {self.data_key!r} must be str, Conversation or messages, got {type(query)}"
            )
        if self.system_prompt is not None and (not history.messages or history[0].role != self.system_role):
            history.messages.insert(0, Message(self.system_role, self.system_prompt))
        return SlotState(
            index=index,
            history=history,
            data=dict(row.data),
            prompt_id=row.prompt_id,
            group_id=row.group_id,
            sample_index=row.sample_index,
        )
