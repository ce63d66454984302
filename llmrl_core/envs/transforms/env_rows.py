"""llmrl's additions to the TensorDict transforms, for transforms inside a
:class:`~llmrl_core.envs.chat_env.ChatEnv`: the env slots behind the rows of the data being transformed, and what a
transform tells the env about a row (:class:`EnvRows`, a part of
:class:`~llmrl_core.envs.transforms.td_base.Transform`; TorchRL's code never calls them)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from tensordict import TensorDictBase


class EnvRows:
    """Which env slot a row is (:meth:`_slot_of`), which rows a step or reset concerns (:meth:`_active_rows`,
    :meth:`_reset_rows`), the reset hook that edits the new conversations (:meth:`_rewrite_reset_prompts`) and the
    notes a transform leaves about a row (:meth:`_note_row`, taken by the env with :meth:`take_row_notes`); they
    read the containing env through the transform's ``parent``."""

    # --- llmrl: the env slots behind the rows, and what a transform tells the env about a row -----
    def _slot_of(self, index: int) -> int:
        """The env slot that row ``index`` of the data being transformed is: llmrl's list calls hand the transforms
        the active slots only, so a row is not always its slot (``env.td_row_slots`` says which, while they run).
        Per-episode state (a persistent interpreter, a browser tab) is kept under it."""
        rows = getattr(self.parent, "td_row_slots", None)
        return rows.get(index, index) if rows else index

    def _active_rows(self, size: int) -> list[int]:
        """The rows of a step's data whose episodes were running (they answered in this step): in a ChatEnv, those
        ``env.td_row_slots`` maps (the list calls hand over the active slots), else all ``size`` rows."""
        rows = getattr(self.parent, "td_row_slots", None)
        return sorted(i for i in rows if i < size) if rows else list(range(size))

    # llmrl: whether ``env.state_dict()`` holds this transform's ``state_dict()`` (a prompt source's cursor)
    env_checkpoint: bool = False

    def _reset_rows(self, tensordict: TensorDictBase | None, tensordict_reset: TensorDictBase) -> list[int]:
        """The rows of ``tensordict_reset`` a ``_reset`` starts new episodes in: all, or those TorchRL's
        ``"_reset"`` entry of ``tensordict`` marks (a partial reset)."""
        flags = tensordict.get("_reset", None) if tensordict is not None else None
        size = tensordict_reset.batch_size[0] if tensordict_reset.batch_dims else 1
        if flags is None:
            return list(range(size))
        marked = torch.as_tensor(flags).reshape(size, -1).any(-1).tolist()
        return [i for i, flag in enumerate(marked) if flag]

    def _rewrite_reset_prompts(
        self, tensordict: TensorDictBase | None, tensordict_reset: TensorDictBase, rewrite: Callable[[Any, int], Any]
    ) -> TensorDictBase:
        """The reset hook of a transform that edits the new conversations: ``rewrite(conversation, slot)`` for each
        row that starts an episode (:meth:`_reset_rows`) of ``("history", "prompt")`` (a ChatEnv lends it in every
        input mode); the others are left as they are."""
        history = tensordict_reset.get(("history", "prompt"), None)
        if history is None:
            raise RuntimeError(
                f"{type(self).__name__} needs the new conversations under ('history', 'prompt') of the reset data (a "
                "ChatEnv hands them to its TensorDict transforms in every input mode)"
            )
        chosen = set(self._reset_rows(tensordict, tensordict_reset))
        conversations = [
            rewrite(c, self._slot_of(i)) if i in chosen else c for i, c in enumerate(history.to_conversations())
        ]
        tensordict_reset["history"].prompt = type(history).from_conversations(conversations)
        return tensordict_reset

    def _note_row(
        self,
        index: int,
        *,
        reward_components: Mapping[str, float] | None = None,
        info: Mapping[str, Any] | None = None,
        tool_call: tuple[str, Any, str, bool] | None = None,
        replace_reward_components: bool = False,
    ) -> None:
        """Tell the env more about row ``index`` of this step than TorchRL's layout carries: the parts of the reward
        this transform wrote (the slot's ``reward_components``: stored with the rollout, averaged per version),
        ``info`` entries (e.g. IFEval's score) and a tool call run ``(tool, arguments, result, failed)`` (the slot's
        ``info["tool_calls"]``, counted in ``num_tool_calls`` / ``tool_errors``). ``replace_reward_components``: the
        slot's earlier parts are dropped first (a transform that replaced the step's reward). ChatEnv takes the
        notes after the transform's ``_step`` (:meth:`take_row_notes`); outside a ChatEnv they are dropped at the
        next take."""
        notes = self.__dict__.setdefault("_row_notes", {}).setdefault(
            index, {"reward_components": {}, "info": {}, "tool_calls": [], "replace_reward_components": False}
        )
        notes["replace_reward_components"] |= replace_reward_components
        notes["reward_components"].update(reward_components or {})
        notes["info"].update(info or {})
        if tool_call is not None:
            notes["tool_calls"].append(tool_call)

    def take_row_notes(self) -> dict[int, dict[str, Any]]:
        """The notes since the last take, per row (then forgotten)."""
        notes = self.__dict__.get("_row_notes") or {}
        self.__dict__["_row_notes"] = {}
        return notes
