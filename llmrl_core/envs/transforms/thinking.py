"""``AddThinkingPrompt``: when a condition holds after a step, nudge the policy to reconsider.

TorchRL's TensorDict transform of the same name and arguments: after each step, ``cond`` is called with each row's
``"next"`` data (a TensorDict holding ``reward``, ``done``, ``("history", "prompt")``, ... for that row); where it
returns True, with ``edit_last_turn`` (role ``assistant``) the last ``<answer>...</answer>`` of the policy's message is
replaced by the prompt (or the prompt is appended when there is none), so the next turn continues the reasoning;
otherwise the prompt is added as a new message of ``role``. ``zero_reward`` (default: ``edit_last_turn``) clears that
row's reward, ``undo_done`` clears its done flags, which reopens the episode. Append it after the reward parser so
``cond`` can read the reward (``cond=lambda td: td["reward"] < 1.0``).

Modes: TorchRL runs it in ``history`` mode only, as llmrl does on TorchRL's TensorDict calls. On llmrl's list calls
(the flows' and ``LLMCollector``'s) it also runs in ``text`` mode, and in ``tokens`` mode with
``edit_last_turn=False`` (the message is appended after the ids sampled so far; an answer already sampled as ids
cannot be rewritten, so ``edit_last_turn=True`` there is refused with that advice). An episode that reached the env's
``max_turns`` stays ended, and its step data says so (a turn bound TorchRL's ``undo_done`` would also undo).
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Callable
from typing import Any, Literal

from tensordict import TensorDictBase

from llmrl_core.data.conversation import Conversation, Message
from llmrl_core.envs.transforms.td_base import Transform

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
_DONE_KEYS = ("done", "terminated", "truncated")


class AddThinkingPrompt(Transform):
    """Adds a reconsider prompt to the rows where ``cond(next_row)`` is True (see the module docstring).

    Args:
        cond: called with one row's ``"next"`` TensorDict; True adds the prompt to that row.
        prompt: the prompt (default: the first built-in one for the perspective).
        random_prompt: draw a built-in prompt at random each time instead.
        role: ``"assistant"`` (the policy's own words) or ``"user"``.
        edit_last_turn: replace the answer in the policy's last message (needs ``role="assistant"``).
        zero_reward: clear the row's reward (default: ``edit_last_turn``).
        undo_done: clear the row's done flags (the episode goes on).
        egocentric: built-in prompts in the first person (default: ``role == "assistant"``).
        seed: seeds ``random_prompt``'s draws (llmrl's addition).
    """

    def __init__(
        self,
        cond: Callable[[TensorDictBase], Any],
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
        if not callable(cond):
            raise TypeError(f"AddThinkingPrompt: cond must be callable (a row's 'next' TensorDict -> bool), got {cond}")
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

    def _check_mode(self) -> None:
        env = self.parent
        if env is None:
            raise RuntimeError("AddThinkingPrompt must be appended to a ChatEnv")
        mode = getattr(getattr(env, "base_env", env), "input_mode", "history")
        if mode == "tokens" and self.edit_last_turn:
            raise ValueError(
                "AddThinkingPrompt(edit_last_turn=True) rewrites the policy's answer, which a ChatEnv in tokens mode "
                "keeps as the ids sampled; use input_mode='history' or 'text', or edit_last_turn=False with "
                "role='user' (the prompt then follows the answer as a new message)"
            )

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        """Add the prompt to the rows whose ``"next"`` data satisfies ``cond``."""
        self._check_mode()
        if next_tensordict.batch_dims == 0:
            rows, chosen = [None], [bool(self.cond(next_tensordict))]
        else:
            rows = list(range(next_tensordict.batch_size[0]))
            chosen = [bool(self.cond(next_tensordict[i])) for i in rows]
        if not any(chosen):
            return next_tensordict
        history = next_tensordict.get(("history", "prompt"), None)
        if history is None:
            raise RuntimeError(
                "AddThinkingPrompt needs the conversation under ('history', 'prompt') of the step's data: on "
                "TorchRL's TensorDict calls only a history-mode ChatEnv carries it (input_mode='history'); the list "
                "calls hand it in every mode"
            )
        conversations = history.to_conversations()  # one per row (one for an unbatched step)
        for row, add in zip(rows, chosen, strict=True):
            if not add:
                continue
            index = 0 if row is None else row
            conversations[index] = self._with_prompt(conversations[index])
            for key in _DONE_KEYS if self.undo_done else ():
                if key in next_tensordict.keys():
                    flags = next_tensordict.get(key)
                    (flags if row is None else flags[row]).zero_()
            if self.zero_reward and "reward" in next_tensordict.keys():
                reward = next_tensordict.get("reward")
                (reward if row is None else reward[row]).zero_()
        new_history = type(history).from_conversations(conversations)
        next_tensordict["history"].prompt = new_history if rows != [None] else new_history[0]
        return next_tensordict

    def _with_prompt(self, conversation: Conversation) -> Conversation:
        messages = list(conversation.messages)
        prompt = self.prompt
        if self.edit_last_turn:
            last = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=None)
            if last is None:
                raise ValueError("AddThinkingPrompt: no assistant message to edit")
            old = messages[last]
            messages[last] = dataclasses.replace(old, content=self.replace_answer(old.text, prompt))
        else:
            messages.append(Message(role=self.role, content=prompt))
        return Conversation(messages)

    def __repr__(self) -> str:
        return (
            f"AddThinkingPrompt(role={self.role!r}, edit_last_turn={self.edit_last_turn}, "
            f"zero_reward={self.zero_reward}, undo_done={self.undo_done})"
        )
