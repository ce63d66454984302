"""What travels between env and policy: :class:`Response` (one slot) and :class:`LLMData` (a batch).

The counterpart of TorchRL's ``LLMData`` / ``Text`` / ``Tokens`` / ``LogProbs`` containers, as plain
dataclasses holding Python lists of strings and 1-D tensors (ragged per slot). A policy reads the prompt
in the env's input mode (``history``, ``text`` or ``tokens``) and gives back, per slot, the response text,
its token ids, the sampler's log-probs and a finish reason; :meth:`LLMData.responses` turns the batch into
the per-slot :class:`Response` list that ``ChatEnv.step`` takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from llmrl_core.data.conversation import ConversationBatch
from llmrl_core.data.tensors import as_padded_tensor


@dataclass
class Response:
    """One slot's sampled assistant turn.

    ``text`` is the decoded response (may end with the end-of-turn marker); ``token_ids`` the sampled
    ids (1-D long), ``log_probs`` their sampler log-probs (1-D float, same length), ``finish_reason``
    ``"stop"`` (end token sampled) or ``"length"`` (cut by the token limit), or None when unknown.
    ``policy_fields`` holds what a TorchRL-style policy wrote for this row beside the answer (its
    ``("tokens", "prompt")``, ``("tokens", "full")``, ``("masks", ...)``), which a collector's dialog-turn rows carry
    as TorchRL's do.
    """

    text: str
    token_ids: torch.Tensor | None = None
    log_probs: torch.Tensor | None = None
    finish_reason: str | None = None
    policy_fields: dict[tuple[str, str], torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise TypeError(f"Response.text must be a string, got {type(self.text).__name__}")
        if self.token_ids is not None and not isinstance(self.token_ids, torch.Tensor):
            self.token_ids = torch.as_tensor(list(self.token_ids), dtype=torch.long)
        if self.log_probs is not None and not isinstance(self.log_probs, torch.Tensor):
            self.log_probs = torch.as_tensor(list(self.log_probs), dtype=torch.float32)
        if self.token_ids is not None and self.log_probs is not None and self.token_ids.shape != self.log_probs.shape:
            raise ValueError(
                f"Response: token_ids {tuple(self.token_ids.shape)} and log_probs "
                f"{tuple(self.log_probs.shape)} must have the same shape"
            )


@dataclass
class LLMData:
    """A batch of prompts and (after generation) responses; every list has one entry per slot."""

    history: ConversationBatch | None = None
    text: list[str] | None = None
    tokens: list[torch.Tensor] | None = None
    text_response: list[str] | None = None
    tokens_response: list[torch.Tensor] | None = None
    log_probs: list[torch.Tensor] | None = None
    finish_reasons: list[str | None] | None = None

    def __post_init__(self) -> None:
        sizes = {name: len(value) for name, value in vars(self).items() if value is not None}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"LLMData fields have different batch sizes: {sizes}")

    @property
    def batch_size(self) -> int:
        """Number of slots."""
        for value in vars(self).values():
            if value is not None:
                return len(value)
        return 0

    @classmethod
    def from_tensordict(cls, td: Any, *, with_history: bool = True) -> LLMData:
        """The prompts a ChatEnv TensorDict carries (a list call's answer, a reset): ``("history", "prompt")`` as
        conversations (unless ``with_history`` is False), ``("text", "prompt")`` and ``("tokens", "prompt")``, each
        where present."""
        keys = td.keys(include_nested=True)
        history = None
        if with_history and ("history", "prompt") in keys:
            history = ConversationBatch(td.get(("history", "prompt")).to_conversations())
        text = list(td.get(("text", "prompt")).tolist()) if ("text", "prompt") in keys else None
        tokens = list(td.get(("tokens", "prompt"), as_list=True)) if ("tokens", "prompt") in keys else None
        return cls(history=history, text=text, tokens=tokens)

    def responses(self) -> list[Response]:
        """The per-slot :class:`Response` objects (needs ``text_response``)."""
        if self.text_response is None:
            raise ValueError("LLMData has no text_response: nothing was generated yet")
        n = len(self.text_response)
        tokens = self.tokens_response or [None] * n
        logps = self.log_probs or [None] * n
        reasons = self.finish_reasons or [None] * n
        return [Response(t, k, lp, r) for t, k, lp, r in zip(self.text_response, tokens, logps, reasons, strict=True)]

    def padded_response_tokens(self, pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """``(B, max_len)`` response ids right-padded with ``pad_id``, and the bool mask of real tokens."""
        if self.tokens_response is None:
            raise ValueError("LLMData has no tokens_response")
        return as_padded_tensor(self.tokens_response, padding_value=pad_id, return_mask=True)  # type: ignore[return-value]
