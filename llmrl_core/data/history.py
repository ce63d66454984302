"""TorchRL's ``History``: a conversation as a tensorclass whose batch shape covers the batch and the messages.

``History.from_chats([[msg, ...], ...])`` gives a ``(B, T)`` History (a lazy stack, so chats may differ in
length); ``history[0]`` is one chat, ``history[:, -1]`` the last message of each. It lives in TensorDicts
(``TensorDict(history=ChatHistory(full=history), batch_size=(B,))``) and renders with
:meth:`History.apply_chat_template`, which picks the template the way TorchRL does (an explicit
``chat_template`` or ``chat_template_name``; else the tokenizer's template when it has ``{% generation %}``
markers; else ChatML) and computes assistant-token masks over assistant content.

The rendering itself is llmrl's one mechanism (:class:`~llmrl_core.data.conversation.Conversation`, which the
rollout engine uses for its slots); :meth:`History.to_conversations` and :meth:`History.from_conversations`
convert between the two.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import LazyStackedTensorDict, TensorClass, TensorDict, lazy_stack, list_to_stack

from llmrl_core.data.chat_templates import MODEL_TEMPLATE, NAMED_TEMPLATES, torchrl_template
from llmrl_core.data.content import ContentBase
from llmrl_core.data.conversation import Conversation, Message


class MissingTokenizerError(TypeError, RuntimeError):
    """``apply_chat_template`` with neither a tokenizer nor a template (TorchRL: a ``TypeError``)."""


def _template_for(tokenizer: Any, chat_template: str | None, chat_template_name: str | None) -> str:
    """The template TorchRL's ``History`` renders with (:func:`~llmrl_core.data.chat_templates.torchrl_template`)."""
    if (
        chat_template_name is not None
        and chat_template_name not in NAMED_TEMPLATES
        and chat_template_name != MODEL_TEMPLATE
    ):
        raise KeyError(f"unknown chat_template_name {chat_template_name!r}; known: {sorted(NAMED_TEMPLATES)}")
    if tokenizer is None and chat_template is None and chat_template_name is None:
        # TorchRL's signature makes tokenizer required: a TypeError there
        raise MissingTokenizerError(
            "History.apply_chat_template: give a tokenizer (or chat_template / chat_template_name) to render with"
        )
    return torchrl_template(tokenizer, chat_template, chat_template_name).template


def _as_list(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return list(value)
    if hasattr(value, "tolist") and not isinstance(value, (str, ContentBase)):
        return list(value.tolist())
    return [value]


class History(TensorClass["nocast"]):
    """A chat (or a batch of chats) as a tensorclass: ``role``, ``content``, ``is_complete``, ``tool_calls``,
    ``tool_responses`` per message; batch shape ``(..., T)`` with the messages along the last dimension."""

    role: str | list[str] | list[list[str]]
    content: str | ContentBase | list[str] | list[ContentBase] | list[list[str]] | list[list[ContentBase]]
    is_complete: bool = True
    tool_calls: list[dict] | None = None
    tool_responses: list[str] | None = None

    def __post_init__(self) -> None:
        if not list_to_stack():
            raise RuntimeError(
                "History needs tensordict's list_to_stack: call tensordict.set_list_to_stack(True).set() "
                "at the start of the script (or set LIST_TO_STACK=1)."
            )

    @classmethod
    def default_spec(cls, shape: tuple[int, ...] = (-1,)) -> Any:
        """TorchRL's spec of History fields of ``shape`` (the messages' dimension last, ``-1`` when ragged); the
        composite's own shape is ``shape[:-1]`` (as TorchRL's; nested in an env's spec it takes the env's)."""
        from llmrl_core.data.tensor_specs import Composite, NonTensor

        fields = {name: NonTensor(shape=shape) for name in ("role", "content")}
        fields["is_complete"] = NonTensor(shape=shape, example_data=True)
        fields.update({name: NonTensor(shape=shape) for name in ("tool_calls", "tool_responses")})
        return Composite(fields, shape=tuple(shape)[:-1], data_cls=cls)

    # --- construction -----------------------------------------------------------------------------
    @classmethod
    def from_chats(cls, chats: Sequence[dict[str, Any]] | Sequence[Sequence[dict[str, Any]]]) -> History:
        """A History from one chat (a list of message dicts: shape ``(T,)``) or a list of chats
        (shape ``(B, T)``, lazily stacked so the chats may have different lengths)."""
        if not chats:
            raise ValueError("History.from_chats needs at least one message or chat")
        if isinstance(chats[0], dict):
            return lazy_stack([cls(**dict(message)) for message in chats])
        return lazy_stack([cls.from_chats(chat) for chat in chats])

    @classmethod
    def from_conversations(cls, conversations: Sequence[Conversation]) -> History:
        """A ``(B, T)`` History from llmrl's internal conversations."""
        return cls.from_chats([[message_dict(m) for m in conv.messages] for conv in conversations])

    @classmethod
    def from_text(cls, text: str | list[str], chat_template_name: str | None = None, **kwargs: Any) -> History:
        """Parse rendered chat text back into a History (``(T,)`` for a string, ``(B, T)`` for a list)."""
        if isinstance(text, list):
            return lazy_stack([cls.from_text(t, chat_template_name=chat_template_name, **kwargs) for t in text])
        conv = Conversation.from_text(text, chat_template_name=chat_template_name, **kwargs)
        return cls.from_chats([message_dict(m) for m in conv.messages])

    # --- conversion -------------------------------------------------------------------------------
    def to_messages(self) -> list[Message]:
        """The messages of a 1-D History (one chat), skipping TorchRL's ``"<none>"`` placeholders."""
        roles = _as_list(self.role)
        contents = _as_list(self.content)
        complete = _as_list(self.is_complete) if self.is_complete is not None else [True] * len(roles)
        calls = _as_list(self.tool_calls) if self.tool_calls is not None else [None] * len(roles)
        replies = _as_list(self.tool_responses) if self.tool_responses is not None else [None] * len(roles)
        out = []
        for role, content, done, call, reply in zip(roles, contents, complete, calls, replies, strict=False):
            if role == "<none>":
                continue
            done = bool(done.item()) if isinstance(done, torch.Tensor) else bool(done)
            out.append(Message(role=role, content=content, is_complete=done, tool_calls=call, tool_responses=reply))
        return out

    def to_conversations(self) -> list[Conversation]:
        """llmrl's internal conversations: one per chat of a ``(B, T)`` History (one for a ``(T,)`` History)."""
        if self.batch_dims == 1:
            return [Conversation(self.to_messages())]
        if self.batch_dims != 2:
            raise ValueError(f"to_conversations needs a (T,) or (B, T) History, got shape {tuple(self.shape)}")
        return [self[i].to_conversations()[0] for i in range(self.batch_size[0])]

    # --- rendering --------------------------------------------------------------------------------
    def apply_chat_template(
        self,
        *,
        tokenizer: Any = None,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        chat_template_name: str | None = None,
        continue_final_message: bool = False,
        tokenize: bool | None = None,
        padding: bool | str = False,
        truncation: bool | str = False,
        return_tensors: str | None = None,
        return_dict: bool | None = None,
        return_assistant_tokens_mask: bool = False,
        **kwargs: Any,
    ) -> str | list[str] | TensorDict:
        """Render the chat(s): a string per chat, or (``tokenize``/``return_dict``/``return_assistant_tokens_mask``)
        a TensorDict with ``input_ids``, ``attention_mask`` and, on request, ``assistant_masks`` (1 on assistant
        content). A ``(B, T)`` History gives a list of strings or a lazy stack of per-chat TensorDicts."""
        template = _template_for(tokenizer, chat_template, chat_template_name)
        if tokenize is None:
            tokenize = return_assistant_tokens_mask or return_tensors is not None
        if return_dict is None:
            return_dict = return_assistant_tokens_mask
        if self.batch_dims > 1:
            rows = [
                self[i].apply_chat_template(
                    tokenizer=tokenizer,
                    add_generation_prompt=add_generation_prompt,
                    chat_template=template,
                    continue_final_message=continue_final_message,
                    tokenize=tokenize,
                    padding=padding,
                    truncation=truncation,
                    return_tensors=return_tensors,
                    return_dict=return_dict,
                    return_assistant_tokens_mask=return_assistant_tokens_mask,
                    **kwargs,
                )
                for i in range(self.batch_size[0])
            ]
            return lazy_stack(rows) if return_dict else rows
        conv = Conversation(self.to_messages())
        if continue_final_message and conv.messages:
            conv.messages[-1].is_complete = False
        if not tokenize and not return_dict:
            return conv.apply_chat_template(
                tokenizer, add_generation_prompt=add_generation_prompt, chat_template=template, **kwargs
            )
        out = conv.apply_chat_template(
            tokenizer,
            add_generation_prompt=add_generation_prompt,
            chat_template=template,
            tokenize=True,
            return_assistant_tokens_mask=return_assistant_tokens_mask,
            include_end_of_turn=False,
            **kwargs,
        )
        if not return_dict:
            return out.input_ids.unsqueeze(0)
        fields: dict[str, torch.Tensor] = {"input_ids": out.input_ids, "attention_mask": out.attention_mask}
        if out.assistant_masks is not None:
            fields["assistant_masks"] = out.assistant_masks.long()
        return TensorDict(fields, batch_size=[])

    # --- growing ------------------------------------------------------------------------------------
    def _grows_in_place(self, dim: int) -> bool:
        """Whether messages along ``dim`` are a lazy stack that can take more in place: then growing ``h[i]`` grows
        the ``i``-th chat of ``h`` too, as TorchRL's in-place ``append``/``extend`` do."""
        return isinstance(self._tensordict, LazyStackedTensorDict) and self._tensordict.stack_dim == dim

    def append(self, history: History, *, inplace: bool = True, dim: int = -1) -> History:
        """Add one message per chat (``history`` has one dimension fewer than ``self``) along ``dim``."""
        if not self.batch_dims:
            raise RuntimeError("Cannot append an element to a batchless History. Call unsqueeze(dim=0) first on self.")
        if self.batch_dims != history.batch_dims + 1:
            raise RuntimeError(
                "The new history to append must have one less dimension than self. "
                f"Got self.ndim={self.ndim} and history.ndim={history.ndim}."
            )
        dim = dim % self.batch_dims
        if inplace and self._grows_in_place(dim):
            self._tensordict.append(history._tensordict)  # a chat taken from a batch grows in that batch too
            return self
        grown = lazy_stack([*self.unbind(dim), history], dim=dim)
        if not inplace:
            return grown
        self.__dict__["_tensordict"] = grown._tensordict
        return self

    def extend(self, history: History, *, inplace: bool = True, dim: int = 0) -> History:
        """Concatenate ``history`` (same number of dimensions) along ``dim``."""
        if not self.batch_dims:
            raise RuntimeError("Cannot add an element to a batchless History. Call unsqueeze(dim=0) first on self.")
        if self.batch_dims != history.batch_dims:
            raise RuntimeError(
                "The new history to extend must have as many dimensions as self. "
                f"Got self.ndim={self.ndim} and history.ndim={history.ndim}."
            )
        dim = dim % self.batch_dims
        if inplace and self._grows_in_place(dim):
            self._tensordict.extend(list(history._tensordict.unbind(dim)))
            return self
        if dim > 0 and self._grows_in_place(0):  # chats of different lengths (ragged): each grows on its own
            rows = zip(self.unbind(0), history.unbind(0), strict=True)
            grown = lazy_stack([row.extend(new, inplace=False, dim=dim - 1) for row, new in rows], dim=0)
        else:
            grown = lazy_stack([*self.unbind(dim), *history.unbind(dim)], dim=dim)
        if not inplace:
            return grown
        self.__dict__["_tensordict"] = grown._tensordict
        return self


def message_dict(message: Message) -> dict[str, Any]:
    """One message as a chat dict (role, content, is_complete; tool calls and responses when present)."""
    out: dict[str, Any] = {"role": message.role, "content": message.content, "is_complete": message.is_complete}
    if message.tool_calls is not None:
        out["tool_calls"] = message.tool_calls
    if message.tool_responses is not None:
        out["tool_responses"] = message.tool_responses
    return out


# TorchRL's module-level table of named templates (its own examples set ``tokenizer.chat_template`` from it).
_CHAT_TEMPLATES: dict[str, str] = {name: named.template for name, named in NAMED_TEMPLATES.items()}

__all__ = ["History", "message_dict"]
