"""``TemplateTransform``: TorchRL's chat-template transform (``torchrl.envs.llm.transforms.format``).

A TensorDict transform on the ``"message"`` entry (TorchRL's keys): on the way in it renders the message through
the tokenizer's chat template with the generation prompt (a string is one user turn; a list of
``{"role", "content"}`` dicts, a :class:`~llmrl_core.data.history.History` or a
:class:`~llmrl_core.data.conversation.Conversation` is the whole chat); on the way back (``inv``, the ``"action"``
entry) it keeps the text of the last assistant turn (what follows the template's generation prompt, without the
turn's end marker).

TorchRL marks it as work in progress: its forward passes a bare string to ``apply_chat_template`` (which fails on
a string) and its inverse reads Llama 3's headers only; llmrl renders a string as a user turn and reads the
generation prompt of whichever template is in use. A ``ChatEnv`` renders its prompts itself (``input_mode="text"``
or ``"tokens"``); TorchRL's ``Tokenizer`` (strings to ids) is :mod:`llmrl_core.envs.transforms.tokenizer`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tensordict import NonTensorData, NonTensorStack
from tensordict.utils import NestedKey

from llmrl_core.data.conversation import Conversation
from llmrl_core.envs.transforms.td_base import Transform

_MARK = "\x00llmrl-answer\x00"


class TemplateTransform(Transform):
    """Applies a chat template to ``"message"`` (forward) and keeps the last assistant turn of ``"action"``
    (inverse), as TorchRL's transform of the same name (see the module docstring).

    ``chat_template`` defaults to the tokenizer's own (``tokenizer.get_chat_template()``, as TorchRL);
    ``chat_template_name`` (llmrl's) names one of :mod:`llmrl_core.data.chat_templates`' templates instead;
    ``template_kwargs`` go to the template.
    """

    def __init__(
        self,
        tokenizer: Any,
        chat_template: str | None = None,
        *,
        chat_template_name: str | None = None,
        in_keys: Sequence[NestedKey] | None = None,
        out_keys: Sequence[NestedKey] | None = None,
        **template_kwargs: Any,
    ) -> None:
        in_keys = list(in_keys) if in_keys is not None else ["message"]
        super().__init__(
            in_keys=in_keys,
            out_keys=list(out_keys) if out_keys is not None else list(in_keys),
            in_keys_inv=["action"],
            out_keys_inv=["action"],
        )
        if chat_template_name is not None:
            from llmrl_core.data.chat_templates import named_template

            chat_template = named_template(chat_template_name).template
        elif chat_template is None:
            chat_template = tokenizer.get_chat_template()
        self.chat_template = chat_template
        self.tokenizer = tokenizer
        self.template_kwargs = template_kwargs

    # --- forward: a message (or chat) rendered with the generation prompt -------------------------
    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            chat_template=self.chat_template,
            **self.template_kwargs,
        )

    def _apply_transform(self, message: Any) -> Any:
        if isinstance(message, NonTensorData | NonTensorStack):
            return _each(message, self._apply_transform)
        if hasattr(message, "to_conversations") and message.batch_dims == 2:  # a History of B chats
            return [self._apply_transform(chat) for chat in message.to_conversations()]
        return self._render(_as_messages(message), add_generation_prompt=True)

    def _reset(self, tensordict: Any, tensordict_reset: Any) -> Any:
        return self._call(tensordict_reset)

    # --- inverse: the last assistant turn of a rendered text --------------------------------------
    def _inv_apply_transform(self, action: Any) -> Any:
        if isinstance(action, NonTensorData | NonTensorStack):
            return _each(action, self._inv_apply_transform)
        if not isinstance(action, str):
            raise TypeError(f"TemplateTransform.inv: expected the action as text, got {type(action).__name__}")
        opening, closing = self._assistant_markers()
        start = action.rfind(opening) if opening else -1
        answer = action[start + len(opening) :] if start >= 0 else action
        trimmed = answer.rstrip()
        if closing and trimmed.endswith(closing):
            return trimmed[: -len(closing)]
        return answer

    def _assistant_markers(self) -> tuple[str, str]:
        """What the template writes before an assistant turn (its generation prompt) and after one (its end)."""
        markers = self.__dict__.get("_markers")
        if markers is None:
            user = [{"role": "user", "content": "u"}]
            bare = self._render(user, add_generation_prompt=False)
            prompted = self._render(user, add_generation_prompt=True)
            opening = prompted[len(bare) :] if prompted.startswith(bare) else ""
            answered = self._render([*user, {"role": "assistant", "content": _MARK}], add_generation_prompt=False)
            closing = answered.split(_MARK, 1)[1].strip() if _MARK in answered else ""
            markers = self.__dict__["_markers"] = (opening, closing)
        return markers

    def __repr__(self) -> str:
        return f"TemplateTransform(in_keys={self.in_keys}, out_keys={self.out_keys})"


def _each(value: NonTensorData | NonTensorStack, apply: Callable[[Any], Any]) -> Any:
    """``apply`` on a non-tensor entry's value (kept one entry) or on each row of a stack (a list back)."""
    if isinstance(value, NonTensorStack):
        return [apply(item) for item in value.tolist()]
    return NonTensorData(apply(value.data), batch_size=value.batch_size, device=value.device)


def _as_messages(message: Any) -> list[dict[str, Any]]:
    """A message as the chat to render: a string is one user turn; a chat (dicts, History, Conversation) itself."""
    if isinstance(message, str):
        return [{"role": "user", "content": message}]
    if hasattr(message, "to_messages"):  # a History of one chat
        message = Conversation(message.to_messages())
    if isinstance(message, Conversation):
        return [{"role": m.role, "content": m.text} for m in message.messages]
    if isinstance(message, Sequence) and all(isinstance(m, Mapping) for m in message):
        return [dict(m) for m in message]
    raise TypeError(
        f"TemplateTransform: a message is a string or a chat (a list of role/content dicts, a History), got "
        f"{type(message).__name__}"
    )
