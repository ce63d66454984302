"""``FewShotExamples``: worked examples as earlier chat turns, placed before the question at reset."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tensordict import TensorDictBase

from llmrl_core.data.conversation import Conversation, Message
from llmrl_core.envs.transforms.td_base import Transform


def example_turns(example: Mapping[str, Any], where: str, assistant_role: str = "assistant") -> list[tuple[str, str]]:
    """The (role, text) turns that answer one example's question.

    An example is ``{"question", "response"}`` (one assistant answer) or ``{"question", "turns"}`` where
    ``turns`` is a list of ``{"role", "content"}`` messages — e.g. an assistant tool call, the tool's output and
    the final answer — ending with an ``assistant`` message. ``where`` names the example in errors.
    """
    question = example.get("question")
    if not isinstance(question, str) or not question:
        raise ValueError(f"{where}: needs a non-empty 'question' string")
    keys = set(example) - {"question"}
    if keys == {"response"}:
        response = example["response"]
        if not isinstance(response, str) or not response:
            raise ValueError(f"{where}: 'response' must be a non-empty string")
        return [(assistant_role, response)]
    if keys != {"turns"}:
        raise ValueError(f"{where}: needs 'question' and one of 'response' or 'turns', got keys {sorted(example)}")
    turns = example["turns"]
    if not isinstance(turns, Sequence) or isinstance(turns, str) or not turns:
        raise ValueError(f"{where}: 'turns' must be a non-empty list of {{role, content}} messages")
    out = []
    for index, turn in enumerate(turns):
        if not isinstance(turn, Mapping) or set(turn) != {"role", "content"}:
            raise ValueError(f"{where}.turns[{index}]: expected a {{role, content}} mapping, got {turn!r:.80}")
        role, content = turn["role"], turn["content"]
        if not isinstance(role, str) or not role or not isinstance(content, str) or not content:
            raise ValueError(f"{where}.turns[{index}]: role and content must be non-empty strings")
        out.append((assistant_role if role == "assistant" else role, content))
    if out[-1][0] != assistant_role:
        raise ValueError(f"{where}: the last of 'turns' must be an assistant message, got role {turns[-1]['role']!r}")
    return out


class FewShotExamples(Transform):
    """Inserts ``examples`` as earlier turns before the last user message of each new conversation (after the
    system prompt, if any). An example is ``{"question", "response"}`` or, to show a tool round trip,
    ``{"question", "turns": [{"role", "content"}, ...]}`` (see :func:`example_turns`).

    Small instruct models follow a shown format far more reliably than a described one (SmolLM2-135M: 1-3 %
    answer tags from an instruction, ~100 % from three examples). Examples are prompt, never policy tokens.
    TorchRL has no few-shot transform; this one is ours, written as TorchRL's TensorDict transforms are: its
    ``_reset`` rewrites ``("history", "prompt")`` of the reset data (a ChatEnv lends the new conversations there in
    every input mode), on a partial reset only in the rows TorchRL's ``"_reset"`` entry marks.
    """

    def __init__(
        self, examples: Sequence[Mapping[str, Any]], user_role: str = "user", assistant_role: str = "assistant"
    ):
        super().__init__()
        self.examples: list[tuple[str, list[tuple[str, str]]]] = [
            (example.get("question", ""), example_turns(example, f"few-shot example {index}", assistant_role))
            for index, example in enumerate(examples)
        ]
        self.user_role = user_role
        self.assistant_role = assistant_role

    def with_examples(self, conversation: Conversation, row: int) -> Conversation:
        """``conversation`` with the example turns just before its last user message."""
        messages = list(conversation.messages)
        where = max((i for i, m in enumerate(messages) if m.role == self.user_role), default=None)
        if where is None:
            raise ValueError(f"row {row}: no {self.user_role!r} message to put the few-shot examples before")
        turns = []
        for question, answer in self.examples:
            turns.append(Message(self.user_role, question))
            turns += [Message(role, text) for role, text in answer]
        messages[where:where] = turns
        return Conversation(messages)

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        """Put the examples into each new conversation of the reset data."""
        return self._rewrite_reset_prompts(tensordict, tensordict_reset, self.with_examples)

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        """Steps are left as they are (the examples are placed once, at reset)."""
        return next_tensordict

    def __repr__(self) -> str:
        return f"FewShotExamples(examples={len(self.examples)})"
