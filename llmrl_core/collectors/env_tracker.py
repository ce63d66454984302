"""Per-env bookkeeping of a running collector: each slot's versions and summed reward components over its
episode, turned into TensorDict rows (:func:`~llmrl_core.collectors.tensordict_batches.episode_row`) when the episode
ends."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tensordict import TensorDict

from llmrl_core.collectors.policy_weights import Version
from llmrl_core.collectors.tensordict_batches import episode_row
from llmrl_core.data.conversation import ConversationBatch
from llmrl_core.data.llm_data import LLMData
from llmrl_core.envs.chat_env import ChatEnv
from llmrl_core.envs.types import EnvOutput


def select_slots(out: EnvOutput, indices: Sequence[int]) -> LLMData:
    """The prompts of ``indices`` in ``out`` as an :class:`LLMData` (all input modes carried along)."""
    return LLMData(
        history=ConversationBatch([out.history[i] for i in indices]),
        text=[out.text[i] for i in indices] if out.text is not None else None,
        tokens=[out.tokens[i] for i in indices] if out.tokens is not None else None,
    )


class EnvTracker:
    """Per-env bookkeeping: versions and summed reward components of each slot's running episode."""

    def __init__(self, env: ChatEnv) -> None:
        self.env = env
        self.out: EnvOutput | None = None
        self.versions: dict[int, list[Version]] = {}
        self.components: dict[int, dict[str, float]] = {}

    def reset(self, prompts: list[Any] | None) -> EnvOutput:
        self.out = self.env.reset_batch(prompts)
        self.versions = {i: [] for i in range(self.out.batch_size)}
        self.components = {i: {} for i in range(self.out.batch_size)}
        return self.out

    def reset_slots(self, indices: list[int], prompts: list[Any] | None) -> EnvOutput:
        self.out = self.env.reset_slots(indices, prompts)
        for i in indices:
            self.versions[i] = []
            self.components[i] = {}
        return self.out

    def record_step(self, out: EnvOutput, active: Sequence[int], version: Version) -> None:
        for i in active:
            self.versions[i].append(version)
            for name, value in out.reward_components[i].items():
                self.components[i][name] = self.components[i].get(name, 0.0) + value
        self.out = out

    def trajectories(self, indices: Sequence[int] | None = None) -> list[TensorDict]:
        """The finished episodes of ``indices`` (all slots by default) as collector rows."""
        tokens_mode = self.env.input_mode == "tokens"
        slots = self.env.slots if indices is None else [self.env.slots[i] for i in indices]
        return [
            episode_row(slot, self.versions[slot.index], self.components[slot.index], tokens_mode, self.env.policy_role)
            for slot in slots
        ]
