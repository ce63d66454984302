"""Per-env bookkeeping of a running collector: each slot's versions and summed reward components over its
episode, turned into TensorDict rows (:func:`~llmrl_core.collectors.tensordict_batches.episode_row`) when the episode
ends."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tensordict import TensorDict, TensorDictBase

from llmrl_core.collectors.policy_weights import Version
from llmrl_core.collectors.tensordict_batches import episode_row
from llmrl_core.data.conversation import ConversationBatch
from llmrl_core.data.llm_data import LLMData
from llmrl_core.envs.chat_env import ChatEnv
from llmrl_core.envs.tensordict_io import active_rows


def select_slots(env: ChatEnv, out: TensorDictBase, indices: Sequence[int]) -> LLMData:
    """The prompts of ``indices`` in ``out`` (a list call's answer of ``env``) as an :class:`LLMData` (all input
    modes carried along; the conversations are the env's own, read before the step that changes them)."""
    prompts = LLMData.from_tensordict(out, with_history=False)
    return LLMData(
        history=ConversationBatch([env.slots[i].history for i in indices]),
        text=[prompts.text[i] for i in indices] if prompts.text is not None else None,
        tokens=[prompts.tokens[i] for i in indices] if prompts.tokens is not None else None,
    )


class EnvTracker:
    """Per-env bookkeeping: versions and summed reward components of each slot's running episode."""

    def __init__(self, env: ChatEnv) -> None:
        self.env = env
        self.out: TensorDictBase | None = None  # the env's latest list-call answer
        self.versions: dict[int, list[Version]] = {}
        self.components: dict[int, dict[str, float]] = {}

    def reset(self, prompts: list[Any] | None) -> TensorDictBase:
        self.out = self.env.reset_batch(prompts)
        self.versions = {i: [] for i in range(self.size)}
        self.components = {i: {} for i in range(self.size)}
        return self.out

    @property
    def size(self) -> int:
        """The env's slot count (0 before the first reset)."""
        return self.out.batch_size[0] if self.out is not None else 0

    @property
    def active(self) -> list[int]:
        """The slots whose episode needs an action (none before the first reset)."""
        return active_rows(self.out) if self.out is not None else []

    def reset_slots(self, indices: list[int], prompts: list[Any] | None) -> TensorDictBase:
        self.out = self.env.reset_slots(indices, prompts)
        for i in indices:
            self.versions[i] = []
            self.components[i] = {}
        return self.out

    def record_step(self, out: TensorDictBase, active: Sequence[int], version: Version) -> None:
        components = out.get("reward_components").tolist()
        for i in active:
            self.versions[i].append(version)
            for name, value in components[i].items():
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
