"""``LLMHashingEnv``: token-by-token generation where each state is identified by a hash of its token chain.

Observation: the token ids so far; action: one token per slot; the new state's hash is
``hashing_fn(previous_hash, token)``. The hash of a prompt folds the same function over its tokens from a
fixed start value, so reaching a sequence by ``reset`` or by ``step`` gives the same id (useful to store a
search tree, e.g. MCTS, by hash only, or to prune repeated chains). The default function is BLAKE2b over the
two int64 values, as a signed int64.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

HASH_START = 0


def blake2b_chain(previous: int, token: int) -> int:
    """Default chain step: BLAKE2b-64 of ``(previous, token)`` as signed int64."""
    payload = int(previous).to_bytes(8, "little", signed=True) + int(token).to_bytes(8, "little", signed=True)
    return int.from_bytes(hashlib.blake2b(payload, digest_size=8).digest(), "little", signed=True)


@dataclass
class HashingOutput:
    """Per-slot token observations, their ``(B,)`` int64 hashes, decoded text (optional), done flags."""

    observation: list[torch.Tensor]
    hashing: torch.Tensor
    done: torch.Tensor
    text: list[str] | None = None


class LLMHashingEnv:
    """Batched token-level env whose states are identified by chained hashes."""

    def __init__(
        self,
        vocab_size: int | None = None,
        *,
        tokenizer: Any = None,
        hashing_fn: Callable[[int, int], int] = blake2b_chain,
        text_output: bool = True,
    ) -> None:
        if vocab_size is None:
            if tokenizer is None:
                raise TypeError("LLMHashingEnv needs vocab_size or a tokenizer")
            vocab_size = len(tokenizer)
        if text_output and tokenizer is None:
            raise ValueError("text_output=True needs a tokenizer to decode observations")
        self.vocab_size = int(vocab_size)
        self.tokenizer = tokenizer
        self.hashing_fn = hashing_fn
        self.text_output = text_output
        self._obs: list[torch.Tensor] = []
        self._hash: list[int] = []

    def hash_tokens(self, tokens: Sequence[int] | torch.Tensor) -> int:
        """The hash of a whole token chain (the same value stepping through it gives)."""
        value = HASH_START
        for token in torch.as_tensor(tokens).tolist():
            value = self.hashing_fn(value, token)
        return value

    def _check_tokens(self, tokens: torch.Tensor, where: str) -> None:
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size):
            raise ValueError(f"{where}: token ids must be in [0, {self.vocab_size}), got {tokens.tolist()[:10]}")

    def reset(self, prompts: Sequence[str] | Sequence[Sequence[int]] | torch.Tensor) -> HashingOutput:
        """Start from prompts (strings are tokenized; or token id lists / a 2-D tensor)."""
        obs = []
        for i, prompt in enumerate(prompts):
            if isinstance(prompt, str):
                if self.tokenizer is None:
                    raise ValueError("string prompts need a tokenizer")
                prompt = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
            tokens = torch.as_tensor(prompt, dtype=torch.long).reshape(-1)
            self._check_tokens(tokens, f"prompt {i}")
            obs.append(tokens)
        self._obs = obs
        self._hash = [self.hash_tokens(t) for t in obs]
        return self._output()

    def step(self, action: torch.Tensor | Sequence[int]) -> HashingOutput:
        """Append one token per slot (``(B,)`` or ``(B, 1)``) and chain the hashes."""
        tokens = torch.as_tensor(action, dtype=torch.long).reshape(-1)
        if tokens.numel() != len(self._obs):
            raise ValueError(f"step() got {tokens.numel()} tokens for {len(self._obs)} slots")
        self._check_tokens(tokens, "action")
        for i, token in enumerate(tokens.tolist()):
            self._obs[i] = torch.cat([self._obs[i], tokens[i : i + 1]])
            self._hash[i] = self.hashing_fn(self._hash[i], token)
        return self._output()

    def _output(self) -> HashingOutput:
        text = [self.tokenizer.decode(t.tolist()) for t in self._obs] if self.text_output else None
        return HashingOutput(
            observation=list(self._obs),
            hashing=torch.tensor(self._hash, dtype=torch.int64),
            done=torch.zeros(len(self._obs), dtype=torch.bool),
            text=text,
        )
