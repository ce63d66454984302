"""``FewShotExamples``: worked examples as earlier chat turns, placed before the question at reset."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llmrl_core.data.history import Message
from llmrl_core.envs.transforms.base import Transform
from llmrl_core.envs.types import SlotState


class FewShotExamples(Transform):
    """Inserts ``examples`` (``{"question", "response"}`` mappings) as user/assistant turns before the last
    user message of each new conversation (after the system prompt, if any).

    Small instruct models follow a shown format far more reliably than a described one (SmolLM2-135M: 1-3 %
    answer tags from an instruction, ~100 % from three examples). Examples are prompt, never policy tokens.
    """

    def __init__(
        self, examples: Sequence[Mapping[str, str]], user_role: str = "user", assistant_role: str = "assistant"
    ):
        super().__init__()
        self.examples: list[tuple[str, str]] = []
        for index, example in enumerate(examples):
            question, response = example.get("question"), example.get("response")
            if not isinstance(question, str) or not isinstance(response, str) or not question or not response:
                raise ValueError(f"few-shot example {index}: needs non-empty 'question' and 'response' strings")
            self.examples.append((question, response))
        self.user_role = user_role
        self.assistant_role = assistant_role

    def reset_slot(self, slot: SlotState) -> None:
        """Insert the example turns just before the slot's last user message."""
        messages = slot.history.messages
        where = max((i for i, m in enumerate(messages) if m.role == self.user_role), default=None)
        if where is None:
            raise ValueError(f"slot {slot.index}: no {self.user_role!r} message to put the examples before")
        turns = []
        for question, response in self.examples:
            turns += [Message(self.user_role, question), Message(self.assistant_role, response)]
        messages[where:where] = turns
