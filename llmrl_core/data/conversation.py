"""llmrl's internal conversations: :class:`Message`, :class:`Conversation` (one chat), :class:`ConversationBatch`.

The rollout engine's own record of a chat (env slots, trajectories, trainer batches): a plain list of
:class:`Message` dataclasses per conversation and a list of conversations per batch, so ragged lengths need no
padding or lazy stacking. TorchRL's ``History`` tensorclass (:class:`llmrl_core.data.history.History`) is the
public data model; ``History.to_conversations`` / ``History.from_conversations`` convert between the two.

``apply_chat_template`` renders through the tokenizer's own template (named fallbacks such as ChatML
when it has none, see :mod:`llmrl_core.data.chat_templates`) and can return assistant-token masks that
cover assistant messages only: tool, user and system tokens are 0, so a loss can ignore tool output.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import torch

from llmrl_core.data.chat_templates import (
    assistant_char_spans,
    char_spans_to_token_mask,
    named_template,
    render,
    resolve_template,
)
from llmrl_core.data.content import Content, ContentBase, content_to_text, normalize_content
from llmrl_core.data.tensors import as_padded_tensor
from llmrl_core.data.text_parsing import parse_text

KNOWN_ROLES = ("system", "user", "assistant", "tool")


@dataclass
class Message:
    """One chat message (TorchRL's Conversation fields: role, content, is_complete, tool_calls, tool_responses)."""

    role: str
    content: Content
    is_complete: bool = True
    tool_calls: list[dict[str, Any]] | None = None
    tool_responses: list[str] | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.role, str) or not self.role:
            raise ValueError(f"message role must be a non-empty string, got {self.role!r}")
        self.content = normalize_content(self.content)

    @property
    def text(self) -> str:
        """The content as text (text parts joined)."""
        return content_to_text(self.content)

    def to_dict(self) -> dict[str, Any]:
        """The message as a JSON-able dict (content parts as dicts; empty optional fields left out)."""
        out: dict[str, Any] = {"role": self.role}
        out["content"] = self.content if isinstance(self.content, str) else [p.to_dict() for p in self.content]
        if not self.is_complete:
            out["is_complete"] = False
        for key in ("tool_calls", "tool_responses", "name"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    def to_template_dict(self) -> dict[str, Any]:
        """The dict a chat template sees: role, text content, and tool_calls / name when set."""
        out: dict[str, Any] = {"role": self.role, "content": self.text}
        if self.tool_calls is not None:
            out["tool_calls"] = self.tool_calls
        if self.name is not None:
            out["name"] = self.name
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any] | Message, where: str = "message") -> Message:
        """Build a message from a dict with at least ``role`` and ``content``; errors name ``where``."""
        if isinstance(data, Message):
            return copy.deepcopy(data)
        if not isinstance(data, dict):
            raise TypeError(f"{where}: expected a dict with 'role' and 'content', got {type(data).__name__}")
        missing = {"role", "content"} - set(data)
        if missing:
            raise ValueError(f"{where}: missing field(s) {sorted(missing)}")
        unknown = set(data) - {"role", "content", "is_complete", "tool_calls", "tool_responses", "name"}
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {sorted(unknown)}")
        try:
            return cls(**data)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{where}: {err}") from err


@dataclass
class TokenizedChat:
    """A rendered conversation and its tokens; ``assistant_masks`` is 1 on assistant-generated tokens."""

    text: str | list[str]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    assistant_masks: torch.Tensor | None = None


def _is_message_like(obj: Any) -> bool:
    return isinstance(obj, Message) or (isinstance(obj, dict) and "role" in obj)


@dataclass
class Conversation:
    """One conversation: an ordered list of :class:`Message` (mutable; ``append`` adds a turn)."""

    messages: list[Message] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.messages = [Message.from_dict(m, where=f"message {i}") for i, m in enumerate(self.messages)]

    # --- construction -------------------------------------------------------------------------
    @overload
    @classmethod
    def from_chats(cls, chats: Sequence[dict[str, Any] | Message]) -> Conversation: ...
    @overload
    @classmethod
    def from_chats(cls, chats: Sequence[Sequence[dict[str, Any] | Message]]) -> ConversationBatch: ...
    @classmethod
    def from_chats(cls, chats):
        """A list of messages gives a :class:`Conversation`; a list of such lists gives a :class:`ConversationBatch`."""
        if not isinstance(chats, list | tuple):
            raise TypeError(f"from_chats expects a list of messages or of chats, got {type(chats).__name__}")
        if chats and all(_is_message_like(m) for m in chats):
            return cls(list(chats))
        return ConversationBatch(
            [cls.from_chats(list(chat)) if not isinstance(chat, Conversation) else chat for chat in chats]
        )

    @classmethod
    def from_text(
        cls,
        text: str | Sequence[str],
        chat_template_name: str | None = None,
        tokenizer: Any = None,
        role: str = "assistant",
    ) -> Conversation | ConversationBatch:
        """Parse rendered chat text back into messages (a list of texts gives a ConversationBatch).

        A last message without its end-of-turn marker is kept with ``is_complete=False``. Text without chat
        markers becomes one ``role`` message. The format comes from ``chat_template_name``, else from the
        markers in the text or in the tokenizer's template.
        """
        if not isinstance(text, str):
            return ConversationBatch([cls.from_text(t, chat_template_name, tokenizer, role) for t in text])  # type: ignore[misc]
        text_format = end = None
        if chat_template_name is not None:
            named = named_template(chat_template_name)
            if named.text_format is None:
                raise ValueError(
                    f"from_text cannot read the {chat_template_name!r} format back into messages (its turns carry no "
                    "markers a parser can trust; TorchRL 0.14.1 misreads or refuses it too): keep the History you "
                    "rendered, or parse with chat_template_name='llama' / 'llama3' / 'chatml' / 'qwen'"
                )
            text_format, end = named.text_format, named.end_of_turn
        elif tokenizer is not None:
            resolved = resolve_template(tokenizer)
            end = resolved.end_of_turn
        return cls([Message(**m) for m in parse_text(text, text_format, end, role)])

    # --- list-like API --------------------------------------------------------------------------
    def append(self, message: Message | dict[str, Any] | Conversation) -> Conversation:
        """Add one message (or all messages of another Conversation); returns self for chaining."""
        if isinstance(message, Conversation):
            self.messages.extend(copy.deepcopy(message.messages))
        else:
            self.messages.append(Message.from_dict(message, where=f"message {len(self.messages)}"))
        return self

    def extend(self, messages: Iterable[Message | dict[str, Any]]) -> Conversation:
        """Add several messages; returns self."""
        for message in messages:
            self.append(message)
        return self

    def copy(self) -> Conversation:
        """A deep copy (messages are not shared)."""
        return Conversation(copy.deepcopy(self.messages))

    def __len__(self) -> int:
        return len(self.messages)

    def __iter__(self) -> Iterator[Message]:
        return iter(self.messages)

    @overload
    def __getitem__(self, index: int) -> Message: ...
    @overload
    def __getitem__(self, index: slice) -> Conversation: ...
    def __getitem__(self, index):
        if isinstance(index, slice):
            return Conversation(copy.deepcopy(self.messages[index]))
        return self.messages[index]

    @property
    def role(self) -> list[str]:
        """The roles, in order (TorchRL's ``Conversation.role``)."""
        return [m.role for m in self.messages]

    @property
    def content(self) -> list[Content]:
        """The contents, in order (TorchRL's ``Conversation.content``)."""
        return [m.content for m in self.messages]

    def to_chat(self) -> list[dict[str, Any]]:
        """The conversation as a list of JSON-able dicts."""
        return [m.to_dict() for m in self.messages]

    # --- rendering ------------------------------------------------------------------------------
    def apply_chat_template(
        self,
        tokenizer: Any = None,
        *,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        chat_template_name: str | None = None,
        tokenize: bool = False,
        return_assistant_tokens_mask: bool = False,
        include_end_of_turn: bool = True,
        mask_roles: tuple[str, ...] = ("assistant",),
        **template_kwargs: Any,
    ) -> str | TokenizedChat:
        """Render the chat; with ``tokenize`` or ``return_assistant_tokens_mask`` return a :class:`TokenizedChat`.

        An incomplete last message is rendered open (no end-of-turn, no generation prompt), so the text is a
        prefix the policy can continue. The assistant mask covers the content of ``mask_roles`` messages and,
        with ``include_end_of_turn`` (default), the end-of-turn token after it. TorchRL's ChatML template masks
        the content only: pass ``include_end_of_turn=False`` for that behaviour.
        """
        resolved = resolve_template(tokenizer, chat_template, chat_template_name)
        msgs = [m.to_template_dict() for m in self.messages]
        open_last = bool(self.messages) and not self.messages[-1].is_complete
        text = render(
            msgs,
            resolved.template,
            tokenizer=tokenizer,
            add_generation_prompt=add_generation_prompt and not open_last,
            **template_kwargs,
        )
        if open_last:
            last_role = self.messages[-1].role
            spans = assistant_char_spans(
                msgs,
                resolved.template,
                text,
                roles=(last_role,),
                include_end_of_turn=False,
                tokenizer=tokenizer,
                **template_kwargs,
            )
            text = text[: spans[-1][1][1]]
        if not tokenize and not return_assistant_tokens_mask:
            return text
        if tokenizer is None:
            raise ValueError("tokenize=True / return_assistant_tokens_mask=True need a tokenizer")
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=return_assistant_tokens_mask)
        input_ids = torch.tensor(enc["input_ids"], dtype=torch.long)
        masks = None
        if return_assistant_tokens_mask:
            if "offset_mapping" not in enc:
                raise ValueError("assistant masks need a fast tokenizer (offset mapping)")
            spans = assistant_char_spans(
                msgs,
                resolved.template,
                text,
                roles=mask_roles,
                end_of_turn=resolved.end_of_turn,
                include_end_of_turn=include_end_of_turn,
                tokenizer=tokenizer,
                lead=resolved.assistant_lead,
                **template_kwargs,
            )
            masks = torch.tensor(char_spans_to_token_mask(enc["offset_mapping"], [s for _, s in spans]))
        return TokenizedChat(text, input_ids, torch.ones_like(input_ids), masks)


@dataclass
class ConversationBatch:
    """A batch of conversations of different lengths (one :class:`Conversation` per slot)."""

    histories: list[Conversation] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.histories = [
            h if isinstance(h, Conversation) else Conversation.from_chats(list(h)) for h in self.histories
        ]

    def __len__(self) -> int:
        return len(self.histories)

    def __iter__(self) -> Iterator[Conversation]:
        return iter(self.histories)

    @overload
    def __getitem__(self, index: int) -> Conversation: ...
    @overload
    def __getitem__(self, index: slice) -> ConversationBatch: ...
    def __getitem__(self, index):
        if isinstance(index, slice):
            return ConversationBatch(self.histories[index])
        return self.histories[index]

    def append(self, messages: Sequence[Message | dict[str, Any] | None]) -> ConversationBatch:
        """Append one message per slot (``None`` leaves that slot unchanged)."""
        if len(messages) != len(self.histories):
            raise ValueError(f"append got {len(messages)} messages for a batch of {len(self.histories)}")
        for history, message in zip(self.histories, messages, strict=True):
            if message is not None:
                history.append(message)
        return self

    def to_chats(self) -> list[list[dict[str, Any]]]:
        """All conversations as lists of dicts."""
        return [h.to_chat() for h in self.histories]

    def apply_chat_template(
        self,
        tokenizer: Any = None,
        *,
        tokenize: bool = False,
        return_assistant_tokens_mask: bool = False,
        **kwargs: Any,
    ) -> list[str] | TokenizedChat:
        """Render every conversation; tokenized output is right-padded into ``(B, max_len)`` tensors."""
        outs = [
            h.apply_chat_template(
                tokenizer, tokenize=tokenize, return_assistant_tokens_mask=return_assistant_tokens_mask, **kwargs
            )
            for h in self.histories
        ]
        if not tokenize and not return_assistant_tokens_mask:
            return outs  # type: ignore[return-value]
        pad_id = getattr(tokenizer, "pad_token_id", None)
        pad_id = 0 if pad_id is None else pad_id
        ids, attn = as_padded_tensor([o.input_ids for o in outs], padding_value=pad_id, return_mask=True)
        masks = None
        if return_assistant_tokens_mask:
            masks = as_padded_tensor([o.assistant_masks for o in outs], padding_value=False)
        return TokenizedChat([o.text for o in outs], ids, attn.long(), masks)


__all__ = ["ContentBase", "Conversation", "ConversationBatch", "KNOWN_ROLES", "Message", "TokenizedChat"]


def episode_start(messages: Sequence[Message], policy_role: str, turns: int) -> int:
    """Index of the first of the last ``turns`` ``policy_role`` messages: where an episode's own answers begin,
    after the prompt and any few-shot example turns (which are also ``policy_role`` messages)."""
    policy = [i for i, m in enumerate(messages) if m.role == policy_role]
    if turns < 1 or turns > len(policy):
        return len(messages)
    return policy[len(policy) - turns]


def episode_prompt(messages: Sequence[Message], policy_role: str, turns: int, user_role: str = "user") -> str:
    """The text of the user message an episode answers: the last ``user_role`` message before its first answer."""
    start = episode_start(messages, policy_role, turns)
    return next((m.text for m in reversed(messages[:start]) if m.role == user_role), "")
