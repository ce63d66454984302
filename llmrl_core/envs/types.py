"""The env's own bookkeeping: :class:`PromptRow` (a prompt and its identity in the run) and :class:`SlotState`
(a conversation slot: its exact sampled ids, policy mask, reward parts).

Neither crosses the env's boundary: every call answers a TensorDict in TorchRL's layout (the list calls with
llmrl's per-row entries, :func:`~llmrl_core.envs.tensordict_io.slots_view`), and transforms are TorchRL's
TensorDict transforms that read and write the slots in that layout (:mod:`llmrl_core.envs.td_list_calls`);
``Transform._note_row`` carries what the layout has no place for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from llmrl_core.data.conversation import Conversation, Message
from llmrl_core.data.llm_data import Response


@dataclass
class PromptRow:
    """One prompt for ``ChatEnv.reset``: the dataset row and its identity in the run.

    ``data`` holds the row's fields (e.g. ``query``/``question``/``answer``); ``prompt_id`` the row's stable id
    in its source; ``group_id`` is shared by the G copies of a prompt (a GRPO group); ``sample_index`` is the
    copy's index inside its group (0..G-1).
    """

    data: dict[str, Any]
    prompt_id: str | int | None = None
    group_id: int | None = None
    sample_index: int = 0


@dataclass
class SlotState:
    """The live state of one conversation slot, kept by the env: what the TensorDict transforms wrote for it (reward,
    its named parts, end flags, ``info``, ``next_fields``) and, in tokens mode, its exact ids (``all_tokens``,
    ``policy_mask``). An env's own dynamics (a subclass's ``_answer_turns``: the gym wrapper's games) change it
    through its methods: ``add_message``, ``add_reward(value, name=...)``, ``terminate``, ``truncate``."""

    index: int
    history: Conversation
    data: dict[str, Any] = field(default_factory=dict)
    prompt_id: str | int | None = None
    group_id: int | None = None
    sample_index: int = 0
    turn: int = 0
    reward: float = 0.0
    episode_reward: float = 0.0
    reward_components: dict[str, float] = field(default_factory=dict)
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    responses: list[Response] = field(default_factory=list)
    token_segments: list[torch.Tensor] = field(default_factory=list)
    segment_is_policy: list[bool] = field(default_factory=list)
    prompt_text: str | None = None
    # what TorchRL TensorDict transforms added to this step's "next" data (kl_penalty, ...), this slot's row of each
    next_fields: dict[Any, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        """True once the episode is over (terminated or truncated)."""
        return self.terminated or self.truncated

    @property
    def last_response(self) -> Response | None:
        """The response given at the latest step, or None before the first step."""
        return self.responses[-1] if self.responses else None

    def last_message(self, role: str | None = None) -> Message | None:
        """The last message (of ``role`` if given), or None."""
        for message in reversed(self.history.messages):
            if role is None or message.role == role:
                return message
        return None

    def add_message(self, role: str, content: Any, **fields: Any) -> Message:
        """Append a message to this slot's conversation and return it."""
        message = Message(role=role, content=content, **fields)
        self.history.append(message)
        return message

    def add_reward(self, value: float, name: str | None = None) -> None:
        """Add ``value`` to this step's reward; ``name`` also records it in ``reward_components``."""
        self.reward += float(value)
        if name is not None:
            self.reward_components[name] = self.reward_components.get(name, 0.0) + float(value)

    def set_reward(self, value: float) -> None:
        """Overwrite this step's reward (components are kept as they are)."""
        self.reward = float(value)

    def terminate(self) -> None:
        """End the episode because the task is finished (e.g. an answer was given)."""
        self.terminated = True

    def truncate(self) -> None:
        """End the episode early (turn limit, token budget)."""
        self.truncated = True

    def all_tokens(self) -> torch.Tensor:
        """Tokens mode: the whole conversation's token ids (prompt, responses, tool/template glue)."""
        return torch.cat(self.token_segments) if self.token_segments else torch.empty(0, dtype=torch.long)

    def policy_mask(self) -> torch.Tensor:
        """Tokens mode: bool mask over :meth:`all_tokens`, True on tokens the policy sampled."""
        parts = [
            torch.full((len(t),), flag, dtype=torch.bool)
            for t, flag in zip(self.token_segments, self.segment_is_policy, strict=True)
        ]
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.bool)
