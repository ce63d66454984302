"""The interface shared by :class:`TransformersWrapper` and :class:`vLLMWrapper`.

Both wrappers take what a ``ChatEnv``'s list call gives (its TensorDict answer, read by
:meth:`LLMData.from_tensordict <llmrl_core.data.llm_data.LLMData.from_tensordict>`) or an
:class:`~llmrl_core.data.llm_data.LLMData` in one of the env's input modes and return an
:class:`LLMData` whose response fields are filled, so environments, collectors and losses do not care
which backend runs:

* ``generate=True``: sample a response per prompt; ``text_response``, ``tokens_response`` (sampled ids,
  the end-of-turn token included when sampled), ``log_probs`` (the sampler's log-prob of each sampled
  token) and ``finish_reasons`` (``"stop"`` / ``"length"``).
* ``generate=False``: score given responses (teacher forcing): ``log_probs`` of every response token,
  optionally the per-token ``entropy`` of the next-token distribution.

Log-probs are always those of the *raw* model distribution (before temperature / top-p), which is what
vLLM reports by default and what a trainer recomputes; sampling settings change which tokens are drawn,
not how they are scored. Prompts become token ids before any backend sees them (history is rendered
with the tokenizer's chat template plus the generation prompt), so the sampled tokens are exactly the
tokens a trainer will score. ``pad_output=True`` also returns right-padded ``(B, T)`` tensors and a mask
in :class:`PaddedResponses`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from tensordict import TensorDictBase

from llmrl_core.data.conversation import Conversation, ConversationBatch
from llmrl_core.data.llm_data import LLMData
from llmrl_core.data.tensors import as_padded_tensor

InputMode = Literal["history", "text", "tokens"]


@dataclass
class SamplingConfig:
    """Sampling settings shared by both backends (``temperature=0`` means greedy)."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass
class PaddedResponses:
    """Right-padded response tensors: ``tokens`` (B, T), ``log_probs`` (B, T), ``mask`` (B, T) bool."""

    tokens: torch.Tensor
    log_probs: torch.Tensor
    mask: torch.Tensor
    entropy: torch.Tensor | None = None


@dataclass
class PolicyOutput(LLMData):
    """:class:`LLMData` plus what only a policy produces: per-token entropy and padded views."""

    entropy: list[torch.Tensor] | None = None
    padded: PaddedResponses | None = None

    def __post_init__(self) -> None:
        padded, self.padded = self.padded, None  # not a per-slot list: keep it out of the size check
        super().__post_init__()
        self.padded = padded


class LLMWrapperBase:
    """Common prompt handling for the policy wrappers; subclasses implement ``_generate`` / ``_score``."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        input_mode: InputMode = "history",
        generate: bool = True,
        sampling: SamplingConfig | None = None,
        return_entropy: bool = False,
        pad_output: bool = False,
        chat_template: str | None = None,
    ) -> None:
        if input_mode not in ("history", "text", "tokens"):
            raise ValueError(f"input_mode must be 'history', 'text' or 'tokens', got {input_mode!r}")
        self.tokenizer = tokenizer
        self.input_mode = input_mode
        self.generate = generate
        self.sampling = sampling or SamplingConfig()
        self.return_entropy = return_entropy
        self.pad_output = pad_output
        self.chat_template = chat_template

    # --- prompts ---------------------------------------------------------------------------------
    def prompt_token_ids(self, data: Any) -> list[list[int]]:
        """Token ids of each prompt in ``data`` (an LLMData), read in this wrapper's input mode."""
        if self.input_mode == "tokens":
            tokens = getattr(data, "tokens", None)
            if tokens is None:
                raise ValueError("input_mode='tokens' but the data has no tokens (is the env in tokens mode?)")
            return [t.tolist() if isinstance(t, torch.Tensor) else list(t) for t in tokens]
        if self.input_mode == "text":
            text = getattr(data, "text", None)
            if text is None:
                raise ValueError("input_mode='text' but the data has no text (is the env in text mode?)")
            return [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in text]
        history = getattr(data, "history", None)
        if history is None:
            raise ValueError("input_mode='history' but the data has no history")
        chats = history if isinstance(history, ConversationBatch) else ConversationBatch(list(history))
        return [self._render_history(h) for h in chats]

    def _render_history(self, history: Conversation) -> list[int]:
        text = history.apply_chat_template(self.tokenizer, add_generation_prompt=True, chat_template=self.chat_template)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    # --- entry point -----------------------------------------------------------------------------
    def __call__(self, data: Any, responses: Sequence[Sequence[int]] | None = None) -> PolicyOutput:
        """Generate for (or, with ``generate=False``, score ``responses`` of) every prompt in ``data``.

        In scoring mode ``responses`` defaults to ``data.tokens_response``.
        """
        if isinstance(data, TensorDictBase):  # a ChatEnv's answer
            data = LLMData.from_tensordict(data)
        prompts = self.prompt_token_ids(data)
        if self.generate:
            out = self._generate(prompts)
        else:
            if responses is None:
                responses = getattr(data, "tokens_response", None)
            if responses is None:
                raise ValueError("generate=False needs the response tokens to score (tokens_response)")
            resp = [r.tolist() if isinstance(r, torch.Tensor) else list(r) for r in responses]
            if len(resp) != len(prompts):
                raise ValueError(f"{len(resp)} responses for {len(prompts)} prompts")
            log_probs, entropy = self._score(prompts, resp)
            out = PolicyOutput(
                tokens=[torch.tensor(p, dtype=torch.long) for p in prompts],
                tokens_response=[torch.tensor(r, dtype=torch.long) for r in resp],
                log_probs=log_probs,
                entropy=entropy if self.return_entropy else None,
            )
        if getattr(data, "history", None) is not None:
            out.history = data.history
        if self.pad_output:
            out.padded = _pad(out)
        return out

    def score(self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Teacher-forced log-prob of each response token, whatever the ``generate`` setting."""
        return self._score([list(p) for p in prompts], [list(r) for r in responses])[0]

    def _generate(self, prompts: list[list[int]]) -> PolicyOutput:
        raise NotImplementedError

    def _score(
        self, prompts: list[list[int]], responses: list[list[int]]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        raise NotImplementedError


def _pad(out: PolicyOutput) -> PaddedResponses:
    assert out.tokens_response is not None and out.log_probs is not None
    tokens, mask = as_padded_tensor(out.tokens_response, padding_value=0, return_mask=True)
    log_probs = as_padded_tensor(out.log_probs, padding_value=0.0)
    entropy = as_padded_tensor(out.entropy, padding_value=0.0) if out.entropy else None
    return PaddedResponses(tokens=tokens, log_probs=log_probs, mask=mask, entropy=entropy)
