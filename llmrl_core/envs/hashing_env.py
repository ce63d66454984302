"""``LLMHashingEnv``: token-by-token generation where each state is identified by a hash (TorchRL's env).

TensorDicts in and out, as TorchRL's: ``env.reset(TensorDict(observation=ids, batch_size=[B]))`` returns the
prompt ids under ``observation_key``, their ``hashing`` ``(B, 1)`` int64 (the hashing module applied to each
row of ids), the decoded ``text`` (``text_output``) and ``done``/``terminated`` ``(B, 1)``; ``env.step(td)`` reads
one token per row under ``"action"`` ``(B, 1)`` and writes under ``"next"`` the ids with the token appended, the
new hash (the hashing module applied to ``[previous hash, token]``), the text and the flags. With the hashes alone a
search tree (e.g. MCTS) can store its nodes, or a data structure prune repeated chains.

The hashing module takes a ``(B, N)`` tensor and returns ``(B,)`` int64. TorchRL's default (``SipHash``) hashes
with Python's ``hash``, so its values change with ``PYTHONHASHSEED``; llmrl's default, :func:`blake2b_rows`, hashes
each row's int64 bytes with BLAKE2b-64, the same in every process.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase
from tensordict.utils import NestedKey


def blake2b_rows(x: torch.Tensor) -> torch.Tensor:
    """Default hashing module: BLAKE2b-64 of each row's int64 bytes, as a signed int64 per row (``(B, N) -> (B,)``)."""
    rows = x.detach().to(torch.int64).cpu().reshape(-1, x.shape[-1]).numpy()
    digests = [
        int.from_bytes(hashlib.blake2b(row.tobytes(), digest_size=8).digest(), "little", signed=True) for row in rows
    ]
    return torch.tensor(digests, dtype=torch.int64).reshape(x.shape[:-1])


class LLMHashingEnv:
    """Token-level env whose states are identified by hashes (TorchRL's arguments; see the module docstring)."""

    def __init__(
        self,
        vocab_size: int | None = None,
        *,
        hashing_module: Callable[[torch.Tensor], torch.Tensor] | None = None,
        observation_key: NestedKey = "observation",
        text_output: bool = True,
        tokenizer: Any = None,
        text_key: NestedKey | None = "text",
    ) -> None:
        if vocab_size is None:
            if tokenizer is None:
                raise TypeError("You must provide a vocab_size integer if tokenizer is `None`.")
            vocab_size = tokenizer.vocab_size
        self.vocab_size = int(vocab_size)
        self.hashing_module = hashing_module if hashing_module is not None else blake2b_rows
        self.observation_key = observation_key
        self.text_output = text_output
        self.text_key = (text_key if text_key is not None else "text") if text_output else None
        self.tokenizer = tokenizer

    # --- TorchRL's calls -------------------------------------------------------------------------
    def make_tensordict(self, input: str | list[str]) -> TensorDictBase:
        """Tokenize a string (or a list of them, one row each) and reset from the ids."""
        if self.tokenizer is None:
            raise ValueError("LLMHashingEnv.make_tensordict needs the env's tokenizer")
        texts = input if isinstance(input, list) else [input]
        ids = self.tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")["input_ids"]
        if isinstance(input, list):
            return self.reset(TensorDict({self.observation_key: ids}, batch_size=[len(texts)]))
        return self.reset(TensorDict({self.observation_key: ids[0]}, batch_size=[]))

    def reset(self, tensordict: TensorDictBase | None = None) -> TensorDictBase:
        """Start from the ids under ``observation_key``: their hash, text and flags are added and it is returned."""
        obs = tensordict.get(self.observation_key, None) if tensordict is not None else None
        if obs is None:
            raise RuntimeError(f"Resetting the {type(self).__name__} environment requires a prompt.")
        return tensordict.update(self._outcome(torch.as_tensor(obs), self._hash(torch.as_tensor(obs)), tensordict))

    def step(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Append the token under ``"action"`` to each row; the outcome goes under ``"next"`` and it is returned."""
        action = tensordict.get("action", None)
        if action is None:
            raise KeyError(f"{type(self).__name__}.step: no 'action' (one token id per row, shape (B, 1))")
        action = torch.as_tensor(action, dtype=torch.int64)
        previous = tensordict.get(self.observation_key)
        obs = torch.cat([previous, action.to(previous.dtype)], -1)
        chained = torch.cat([tensordict.get("hashing"), action], -1)
        return tensordict.set("next", self._outcome(obs, self._hash(chained), tensordict))

    def set_seed(self, seed: int | None = None) -> int | None:
        """The env has no randomness: the seed is returned unchanged."""
        return seed

    # --- helpers ---------------------------------------------------------------------------------
    def _hash(self, values: torch.Tensor) -> torch.Tensor:
        """``(B, 1)`` hashes of ``(B, N)`` rows (``(1,)`` for one row)."""
        if values.ndim > 1:
            return self.hashing_module(values).unsqueeze(-1)
        return self.hashing_module(values.unsqueeze(0)).transpose(0, -1)

    def _outcome(self, obs: torch.Tensor, hashing: torch.Tensor, tensordict: TensorDictBase) -> TensorDict:
        flags = torch.zeros((*tensordict.batch_size, 1), dtype=torch.bool)
        out = TensorDict(
            {self.observation_key: obs, "hashing": hashing, "done": flags, "terminated": flags.clone()},
            batch_size=tensordict.batch_size,
        )
        if self.text_key is not None:
            if self.tokenizer is None:
                raise ValueError("LLMHashingEnv: text_output=True needs a tokenizer to decode the ids (or pass False)")
            if obs.ndim > 1:
                out.set(self.text_key, NonTensorStack.from_list(self.tokenizer.batch_decode(obs)))
            else:
                out.set(self.text_key, NonTensorData(self.tokenizer.decode(obs)))
        return out

    def __repr__(self) -> str:
        return f"LLMHashingEnv(vocab_size={self.vocab_size}, observation_key={self.observation_key!r})"
