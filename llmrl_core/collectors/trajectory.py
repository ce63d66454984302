"""What a collector hands out: :class:`DialogTurn` (one policy turn) and :class:`Trajectory` (an episode)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from llmrl_core.data.conversation import Conversation
from llmrl_core.data.llm_data import Response
from llmrl_core.envs.types import SlotState


@dataclass
class DialogTurn:
    """One sampled assistant turn with the prompt it answered and what the env made of it."""

    prompt: Conversation
    response: Response
    reward: float
    reward_components: dict[str, float]
    done: bool
    turn: int
    policy_version: int | str | None
    prompt_id: str | int | None = None
    group_id: int | None = None
    sample_index: int = 0
    prompt_tokens: torch.Tensor | None = None  # tokens mode: the prompt's ids as the engine saw them
    data: dict[str, Any] = field(default_factory=dict)  # the prompt row's fields (query, answer, ...)
    # what the env's TorchRL TensorDict transforms added to the step's "next" data (kl_penalty, ...)
    next_fields: dict[Any, Any] = field(default_factory=dict)


@dataclass
class Trajectory:
    """A finished episode of one env slot.

    ``policy_versions`` holds the version that sampled each turn (``policy_version`` is the first; None
    entries when the collector does not track versions);
    ``tokens`` / ``policy_mask`` are set when the env ran in tokens mode (the exact sampled ids, with
    True on the tokens the policy produced). ``reward`` is the episode's summed reward and
    ``reward_components`` the summed named parts.
    """

    history: Conversation
    responses: list[Response]
    reward: float
    reward_components: dict[str, float]
    terminated: bool
    truncated: bool
    policy_versions: list[int | str | None]
    prompt_id: str | int | None = None
    group_id: int | None = None
    sample_index: int = 0
    data: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    tokens: torch.Tensor | None = None
    policy_mask: torch.Tensor | None = None

    @property
    def policy_version(self) -> int | str | None:
        """The version that sampled the first turn."""
        return self.policy_versions[0] if self.policy_versions else None

    @property
    def num_turns(self) -> int:
        """How many policy turns the episode took."""
        return len(self.responses)

    @property
    def finish_reason(self) -> str | None:
        """The sampler's finish reason of the last turn."""
        return self.responses[-1].finish_reason if self.responses else None

    @classmethod
    def from_slot(
        cls, slot: SlotState, versions: list[int | str | None], components: dict[str, float], tokens_mode: bool
    ) -> Trajectory:
        """Snapshot a finished env slot (the slot is reused on the next reset, so everything is copied)."""
        return cls(
            history=slot.history.copy(),
            responses=list(slot.responses),
            reward=float(slot.episode_reward),
            reward_components=dict(components),
            terminated=slot.terminated,
            truncated=slot.truncated,
            policy_versions=list(versions),
            prompt_id=slot.prompt_id,
            group_id=slot.group_id,
            sample_index=slot.sample_index,
            data=dict(slot.data),
            info=dict(slot.info),
            tokens=slot.all_tokens().clone() if tokens_mode else None,
            policy_mask=slot.policy_mask().clone() if tokens_mode else None,
        )
