"""TorchRL's LLM data containers (``torchrl.modules.llm.policies``): ``ChatHistory``, ``Text``, ``Tokens``,
``LogProbs`` and ``Masks``.

Each holds one quantity of a policy call in its three views — ``prompt`` (what the model was given),
``response`` (what it produced) and ``full`` (both) — so a TensorDict reads
``td["history"].prompt``, ``td.get(("tokens", "full"))``, ``td.get(("log_probs", "full"), as_list=True)`` or
``td.get(("masks", "all_assistant_mask"))`` exactly as in TorchRL. ``padded`` records whether the tensors are
right-padded ``(B, T)`` batches (``pad_output=True``) or ragged per-sample tensors.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from tensordict import TensorClass, lazy_stack

from llmrl_core.data.history import History
from llmrl_core.data.tensor_specs import Composite, NonTensor, Unbounded

_FIELDS = ("prompt", "response", "full")


def _spec_keys(cls: type, keys: list[str] | None) -> list[str]:
    keys = list(_FIELDS if keys is None else keys)
    unknown = [key for key in keys if key not in _FIELDS]
    if unknown:
        raise ValueError(f"{cls.__name__}.default_spec: unknown keys {unknown} (one of {list(_FIELDS)})")
    return keys


class Tokens(TensorClass["nocast"]):
    """Token ids of the prompt, the response and the full sequence."""

    prompt: torch.Tensor | None = None
    response: torch.Tensor | None = None
    full: torch.Tensor | None = None
    padded: bool | None = None

    @classmethod
    def default_spec(cls, shape: tuple[int, ...] = (-1,), keys: list[str] | None = None) -> Composite:
        """TorchRL's spec of these fields: each asked key ragged token ids ``shape + (-1,)``, and ``padded``; the
        composite's own shape is ``shape[:-1]`` (as TorchRL's; nested in an env's spec it takes the env's)."""
        specs: dict[str, Any] = {key: Unbounded(shape=(*shape, -1)) for key in _spec_keys(cls, keys)}
        specs["padded"] = NonTensor(shape=shape, example_data=False)
        return Composite(specs, shape=shape[:-1], data_cls=cls)


class Masks(TensorClass["nocast"]):
    """Attention mask of the full sequence and the mask of its assistant tokens."""

    all_attention_mask: torch.Tensor | None = None
    all_assistant_mask: torch.Tensor | None = None
    padded: bool | None = None


class LogProbs(TensorClass["nocast"]):
    """Per-token log-probabilities of the prompt, the response and the full sequence."""

    prompt: torch.Tensor | None = None
    response: torch.Tensor | None = None
    full: torch.Tensor | None = None
    padded: bool | None = None


class Text(TensorClass["nocast"]):
    """Rendered text of the prompt, the response and the full conversation."""

    prompt: str | None = None
    response: str | None = None
    full: str | None = None

    @classmethod
    def default_spec(cls, shape: tuple[int, ...] = (-1,), keys: list[str] | None = None) -> Composite:
        """TorchRL's spec of these fields: each asked key a string per sample (composite shape ``shape[:-1]``)."""
        specs = {key: NonTensor(shape=shape, example_data="a string") for key in _spec_keys(cls, keys)}
        return Composite(specs, shape=shape[:-1], data_cls=cls)


class ChatHistory(TensorClass["nocast"]):
    """Conversations (:class:`~llmrl_core.data.History`) of the prompt, the response and the full exchange.

    Each History carries one more dimension than the container (the messages); a History given with the
    container's own number of dimensions is taken as one message per sample and gets that dimension, with a
    warning, as in TorchRL.
    """

    prompt: History | None = None
    response: History | None = None
    full: History | None = None

    def __post_init__(self) -> None:
        for name in ("prompt", "response", "full"):
            value = getattr(self, name)
            if value is not None and getattr(value, "batch_dims", None) == self.batch_dims:
                warnings.warn(
                    f"ChatHistory.{name} should have one more batch dimension than the ChatHistory (the messages); "
                    f"got {value.batch_dims} and {self.batch_dims}: adding it along the last dimension.",
                    stacklevel=2,
                )
                setattr(self, name, lazy_stack([value], -1))

    @classmethod
    def default_spec(cls, shape: tuple[int, ...] = (-1,), keys: list[str] | None = None) -> Composite:
        """TorchRL's spec of these fields: each asked key a :meth:`History.default_spec` of ``shape + (-1,)``
        (one entry per message; composite shape ``shape[:-1]``)."""
        specs = {key: History.default_spec(shape=(*shape, -1)) for key in _spec_keys(cls, keys)}
        return Composite(specs, shape=shape[:-1], data_cls=cls)

    def apply_chat_template(self, **kwargs: Any) -> Any:
        """Render the conversation a policy continues next — ``prompt`` (else ``full``) — with
        :meth:`History.apply_chat_template` (same arguments)."""
        history = self.prompt if self.prompt is not None else self.full
        if history is None:
            raise ValueError("ChatHistory.apply_chat_template: neither prompt nor full is set")
        return history.apply_chat_template(**kwargs)


__all__ = ["ChatHistory", "LogProbs", "Masks", "Text", "Tokens"]
