"""``AddThinkingPrompt``: when a condition holds after a step, nudge the policy to reconsider.

Semantics follow TorchRL's transform of the same name: with ``edit_last_turn`` (role ``assistant``) the last
``<answer>...</answer>`` of the policy's message is replaced by the prompt (or the prompt is appended when
there is none), so the next turn continues the reasoning; otherwise the prompt is added as a new message of
``role``. ``zero_reward`` (default: ``edit_last_turn``) clears this step's reward, ``undo_done`` reopens the
episode. ``cond`` receives the :class:`~llmrl_core.envs.types.SlotState`; put this transform after the reward
parser so the condition can read the reward.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Literal

from llmrl_core.envs.transforms.base import SlotTransform
from llmrl_core.envs.types import SlotState

FIRST_PERSON_PROMPTS = (
    "Hold on, let me go over this again more carefully.",
    "Let me check each step once more before answering.",
    "I am not sure this is right; let me redo the calculation.",
)
SECOND_PERSON_PROMPTS = (
    "Please go over this again more carefully.",
    "Check each step once more before you answer.",
    "That may be wrong; redo the calculation step by step.",
)
_LAST_ANSWER = re.compile(r"<answer>.*?</answer>", re.DOTALL)


class AddThinkingPrompt(SlotTransform):
    """Adds a reconsider prompt to slots where ``cond(slot)`` is True (see the module docstring)."""

    writes_reward = False

    def __init__(
        self,
        cond: Callable[[SlotState], bool],
        prompt: str | None = None,
        random_prompt: bool = False,
        role: Literal["user", "assistant"] = "assistant",
        edit_last_turn: bool = True,
        zero_reward: bool | None = None,
        undo_done: bool = True,
        egocentric: bool | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        if edit_last_turn and role != "assistant":
            raise ValueError("edit_last_turn=True needs role='assistant'")
        self.cond = cond
        self.role = role
        self.egocentric = (role == "assistant") if egocentric is None else egocentric
        self.prompts = FIRST_PERSON_PROMPTS if self.egocentric else SECOND_PERSON_PROMPTS
        self._prompt = prompt if prompt is not None else self.prompts[0]
        self.random_prompt = random_prompt
        self.edit_last_turn = edit_last_turn
        self.zero_reward = edit_last_turn if zero_reward is None else zero_reward
        self.undo_done = undo_done
        self._rng = random.Random(seed)

    @property
    def prompt(self) -> str:
        """The prompt to add (a random built-in one when ``random_prompt``)."""
        return self._rng.choice(self.prompts) if self.random_prompt else self._prompt

    def replace_answer(self, content: str, prompt: str) -> str:
        """``content`` with its last answer block replaced by ``prompt`` (appended when there is none)."""
        matches = list(_LAST_ANSWER.finditer(content))
        if not matches:
            return content.rstrip() + "\n\n" + prompt
        start, end = matches[-1].span()
        return (content[:start] + prompt + content[end:]).rstrip()

    def step_slot(self, slot: SlotState) -> None:
        """Apply the prompt when the condition holds."""
        if not self.cond(slot):
            return
        prompt = self.prompt
        if self.edit_last_turn:
            message = slot.last_message("assistant")
            if message is None:
                raise ValueError(f"slot {slot.index}: no assistant message to edit")
            message.content = self.replace_answer(message.text, prompt)
        else:
            slot.add_message(self.role, prompt)
        if self.zero_reward:
            slot.set_reward(0.0)
        if self.undo_done:
            slot.terminated = False
            slot.truncated = False
        slot.info["thinking_prompt_added"] = True
