"""The checkpointable state of :class:`~llmrl_core.envs.chat_env.ChatEnv` (:class:`EnvCheckpoint`, one of its base
classes): the state of the TensorDict transforms checkpointed with the env (e.g. the primer's cursor) and the
primer rows no slot has taken yet after a partial reset."""

from __future__ import annotations

from typing import Any

from llmrl_core.envs.types import PromptRow


class EnvCheckpoint:
    """``state_dict`` / ``load_state_dict`` of the env; the env sets ``td_transforms`` and ``_pending_rows``."""

    td_transforms: list[Any]
    _pending_rows: list[PromptRow]

    def state_dict(self) -> dict[str, Any]:
        """The transforms' checkpointable state, by position: those of the TensorDict transforms that are
        checkpointed with the env (``td_transforms``: those whose ``env_checkpoint`` is True, e.g. the primer's
        cursor).

        After a partial reset, the primer rows no slot has taken yet are saved too (``pending_prompts``).
        """
        state: dict[str, Any] = {}
        if self._checkpointed_td_transforms():
            state["td_transforms"] = [t.state_dict() for t in self._checkpointed_td_transforms()]
        if self._pending_rows:
            state["pending_prompts"] = [
                {"data": r.data, "prompt_id": r.prompt_id, "group_id": r.group_id, "sample_index": r.sample_index}
                for r in self._pending_rows
            ]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output into the same transform chain."""
        if any(state.get("transforms") or []):  # saved when llmrl had per-conversation transforms with state
            raise ValueError(
                "the state holds per-conversation transforms' state ('transforms'), saved by an llmrl whose "
                "transforms were not all TorchRL's TensorDict transforms; start the run afresh"
            )
        checkpointed, td_states = self._checkpointed_td_transforms(), state.get("td_transforms", [])
        if len(td_states) != len(checkpointed):
            names = [type(t).__name__ for t in checkpointed]
            raise ValueError(
                f"state has {len(td_states)} TensorDict transform entries, the env checkpoints {len(checkpointed)} "
                f"({names})"
            )
        for transform, sub in zip(checkpointed, td_states, strict=True):
            transform.load_state_dict(sub)
        self._pending_rows = [PromptRow(**dict(row)) for row in state.get("pending_prompts", [])]

    def _checkpointed_td_transforms(self) -> list[Any]:
        return [t for t in self.td_transforms if getattr(t, "env_checkpoint", False)]
