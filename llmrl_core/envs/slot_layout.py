"""The slots of :class:`~llmrl_core.envs.chat_env.ChatEnv` in TorchRL's layout (:class:`SlotLayout`, one of its base
classes): the prompts in the env's input mode, the entries a step writes under ``"next"``, the TensorDict calls'
answer (:func:`~llmrl_core.envs.tensordict_io.output_to_tensordict`) and the list calls'
(:func:`~llmrl_core.envs.tensordict_io.slots_view`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tensordict import TensorDict, TensorDictBase

from llmrl_core.envs.tensordict_io import SlotPrompts, add_row_fields, output_to_tensordict, slots_view
from llmrl_core.envs.types import SlotState


class SlotLayout:
    """The env's answers in TorchRL's layout; the env sets ``input_mode``, ``td_transforms`` and ``slots`` and has
    ``_render`` (:class:`~llmrl_core.envs.slot_tokens.SlotTokens`), ``can_cut_short`` and ``reward_row_shape``
    (:class:`~llmrl_core.envs.env_specs.EnvSpecs`)."""

    input_mode: str
    td_transforms: list[Any]
    slots: list[SlotState]

    def step_layout(self, slots: Sequence[SlotState]) -> dict[str, Any]:
        """Which entries a TensorDict step writes under ``"next"`` besides the prompt and done flags: ``reward``
        when the env or a transform may reward (:meth:`~llmrl_core.envs.env_specs.EnvSpecs.reward_row_shape`; each
        row of the longest ``reward_shape`` among them), ``truncated`` when the env can cut an episode short
        (``max_turns``, ``max_prompt_tokens``) or a transform did. TorchRL's bare ``ChatEnv`` writes neither; its
        ``DatasetChatEnv`` both (a reward parser, a step counter)."""
        truncated = self.can_cut_short() or any(slot.truncated for slot in slots)
        return {"step": True, "reward": self.reward_row_shape(), "truncated": truncated}

    def _with_row_fields(self, next_td: TensorDictBase, slots: Sequence[SlotState]) -> TensorDictBase:
        """An env fed by a ``DataLoadingPrimer`` carries the prompt rows' fields (``query``, ``answer``, ...) in a
        step's ``"next"`` data too, as TorchRL's primer does (its reward parsers read ``("next", "answer")``)."""
        from llmrl_core.envs.primer import DataLoadingPrimer

        if any(isinstance(transform, DataLoadingPrimer) for transform in self.td_transforms):
            add_row_fields(next_td, [slot.data for slot in slots], self.input_mode)
        return next_td

    def _prompts_of(self, slots: Sequence[SlotState]) -> SlotPrompts:
        """The slots' prompts in the env's input mode: rendered text (text, tokens modes), exact ids (tokens)."""
        if self.input_mode == "text":
            return SlotPrompts(text=[self._render(s.history, add_generation_prompt=not s.done) for s in slots])
        if self.input_mode == "tokens":
            return SlotPrompts(text=[s.prompt_text or "" for s in slots], tokens=[s.all_tokens() for s in slots])
        return SlotPrompts()

    def _layout(self, slots: Sequence[SlotState], **layout: Any) -> TensorDict:
        """``slots`` in TorchRL's layout (the TensorDict calls' answer; ``layout``: :meth:`step_layout`'s)."""
        return output_to_tensordict(slots, self._prompts_of(slots), self.input_mode, **layout)

    def _view(self) -> TensorDict:
        """llmrl's list calls' answer: every slot (:func:`~llmrl_core.envs.tensordict_io.slots_view`)."""
        return slots_view(self.slots, self._prompts_of(self.slots))
