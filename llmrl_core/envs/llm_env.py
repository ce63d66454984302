"""``LLMEnv``: the plain completion env of TorchRL's LLM API (observation + action -> next observation).

The observation is text (``from_text=True``) or token ids; a step appends each slot's action to its
observation. With ``eos_token_id`` a slot is done once its action tokens contain it (text actions are
tokenized with ``tokenizer`` for that check); with ``max_length`` (tokens, or characters in text mode
without a tokenizer) a longer observation is truncated. Reward is 0: add it in a subclass or with a
reward function. Prompts come from ``reset(prompts)`` or, without them, from an optional ``primer``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from llmrl_core.envs.primer import DataLoadingPrimer


@dataclass
class LLMEnvOutput:
    """Observations (text or 1-D token tensors) and per-slot ``(B,)`` reward/done flags."""

    observation: list[str] | list[torch.Tensor]
    reward: torch.Tensor
    done: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    data: list[dict[str, Any]]


class LLMEnv:
    """Batched completion env: ``reset(prompts)`` then ``step(actions)`` appends actions to observations."""

    def __init__(
        self,
        *,
        from_text: bool = True,
        tokenizer: Any = None,
        eos_token_id: int | None = None,
        max_length: int | None = None,
        primer: DataLoadingPrimer | None = None,
        str_key: str = "query",
    ) -> None:
        if not from_text and tokenizer is None and primer is not None:
            raise ValueError("a token-mode LLMEnv fed by a primer needs a tokenizer to encode the rows")
        self.from_text = from_text
        self.tokenizer = tokenizer
        self.eos_token_id = eos_token_id
        self.max_length = max_length
        self.primer = primer
        self.str_key = str_key
        self._obs: list[Any] = []
        self._data: list[dict[str, Any]] = []
        self._done: list[bool] = []

    def reset(self, prompts: Sequence[str] | Sequence[torch.Tensor] | None = None) -> LLMEnvOutput:
        """Start from ``prompts`` (strings or token tensors) or from the primer's next batch."""
        if prompts is None:
            if self.primer is None:
                raise ValueError("LLMEnv.reset() needs prompts or a primer")
            rows = self.primer.next_batch()
            self._data = [r.data for r in rows]
            texts = [self._row_text(r.data, i) for i, r in enumerate(rows)]
            prompts = texts if self.from_text else [self._encode(t) for t in texts]
        else:
            self._data = [{} for _ in prompts]
        self._obs = [self._check_obs(p, i) for i, p in enumerate(prompts)]
        self._done = [False] * len(self._obs)
        return self._output([0.0] * len(self._obs), [False] * len(self._obs))

    def _row_text(self, row: dict[str, Any], index: int) -> str:
        if self.str_key not in row:
            raise ValueError(f"primer row {index} has no {self.str_key!r} field (fields: {sorted(row)})")
        return str(row[self.str_key])

    def _encode(self, text: str) -> torch.Tensor:
        return torch.tensor(self.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)

    def _check_obs(self, obs: Any, index: int) -> Any:
        if self.from_text and not isinstance(obs, str):
            raise TypeError(f"slot {index}: text-mode LLMEnv expects strings, got {type(obs).__name__}")
        if not self.from_text:
            obs = obs if isinstance(obs, torch.Tensor) else torch.as_tensor(list(obs), dtype=torch.long)
            if obs.ndim != 1:
                raise ValueError(f"slot {index}: token observation must be 1-D, got shape {tuple(obs.shape)}")
        return obs

    def step(
        self, actions: Sequence[str] | Sequence[torch.Tensor], action_tokens: Sequence[torch.Tensor] | None = None
    ) -> LLMEnvOutput:
        """Append each action; ``action_tokens`` (text mode) gives the ids for the EOS check."""
        if not self._obs:
            raise RuntimeError("step() called before reset()")
        if len(actions) != len(self._obs):
            raise ValueError(f"step() got {len(actions)} actions for {len(self._obs)} slots")
        truncated = [False] * len(self._obs)
        for i, action in enumerate(actions):
            if self._done[i]:
                continue
            action = self._check_obs(action, i)
            tokens = action if not self.from_text else (action_tokens[i] if action_tokens is not None else None)
            if self.eos_token_id is not None:
                if tokens is None and self.tokenizer is not None:
                    tokens = self._encode(action)
                if tokens is None:
                    raise ValueError("eos_token_id is set but text actions come without tokens or a tokenizer")
                self._done[i] = bool((torch.as_tensor(tokens) == self.eos_token_id).any())
            self._obs[i] = self._obs[i] + action if self.from_text else torch.cat([self._obs[i], action])
            if self.max_length is not None and len(self._obs[i]) >= self.max_length and not self._done[i]:
                self._obs[i] = self._obs[i][: self.max_length]
                truncated[i] = True
                self._done[i] = True
        return self._output([0.0] * len(self._obs), truncated)

    def _output(self, rewards: list[float], truncated: list[bool]) -> LLMEnvOutput:
        done = torch.tensor(self._done, dtype=torch.bool)
        trunc = torch.tensor(truncated, dtype=torch.bool)
        return LLMEnvOutput(
            observation=list(self._obs),
            reward=torch.tensor(rewards, dtype=torch.float32),
            done=done,
            terminated=done & ~trunc,
            truncated=trunc,
            data=self._data,
        )
