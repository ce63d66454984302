"""``CategoricalSequential``: a per-token categorical distribution over a batch of token sequences.

Built from next-token logits ``(*B, T, V)`` (e.g. a causal LM's output, shifted so position ``t`` predicts
token ``t``), an optional ``temperature`` that divides them, and a position mask ``(*B, T)`` that says which
positions belong to the distribution (response / assistant tokens; False on prompt and padding).

Difference from TorchRL on purpose: in TorchRL ``CategoricalSequential`` was the base *module* of the LLM
wrappers (later ``LLMWrapperBase``) whose ``get_dist`` ran the model and returned a ``MaskedCategorical`` over
padded logits, with the mask inferred as ``logits != padding_value``; the newer ``LLMMaskedCategorical`` takes
an explicit position mask. Without TensorDict there is no module/keys layer to keep, so ours is the
distribution itself, with the semantics of TorchRL's position-masked LLM distribution where they make sense:

* ``log_prob(tokens)``: log-prob of each token, **0 where masked off** (also where the token equals
  ``ignore_index``, -100 by default, as with cross-entropy's ``ignore_index``), computed in at least fp32;
* ``entropy()``: per-position entropy, **0 where masked off** (TorchRL's version returns the entropy of a
  uniform distribution, ``log V``, at masked positions because it fills their logits with one constant; 0
  sums cleanly into a masked mean);
* ``mode`` / ``sample()``: argmax / a draw at every valid position; masked positions hold ``pad_token_id``
  instead of an arbitrary token;
* only position-level masks (no per-vocabulary-entry masks) and no ``rsample``.

Only the valid positions' logits are normalised, so padding with garbage (or -inf) logits is harmless.
"""

from __future__ import annotations

import torch
from torch.distributions import Categorical, Distribution, constraints


class CategoricalSequential(Distribution):
    """Independent categoricals over the positions of token sequences, restricted to a position mask.

    Args:
        logits: unnormalised next-token scores, shape ``(*batch, T, V)``.
        mask: bool ``(*batch, T)``, True at the positions that belong to the distribution; None = all.
        temperature: the logits are divided by it (> 0); the distribution a sampler at that temperature draws.
        ignore_index: a token id that :meth:`log_prob` treats as masked off (like ``F.cross_entropy``).
        pad_token_id: the id :attr:`mode` and :meth:`sample` put at masked positions.

    ``batch_shape`` is ``(*batch, T)`` and ``event_shape`` is ``()``, as for ``torch.distributions.Categorical``.
    """

    arg_constraints: dict[str, constraints.Constraint] = {}
    support = constraints.nonnegative_integer
    has_enumerate_support = False

    def __init__(
        self,
        logits: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        temperature: float = 1.0,
        ignore_index: int = -100,
        pad_token_id: int = 0,
    ) -> None:
        if logits.ndim < 2:
            raise ValueError(f"logits must have shape (*batch, T, V), got {tuple(logits.shape)}")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        if mask is None:
            mask = torch.ones(logits.shape[:-1], dtype=torch.bool, device=logits.device)
        if mask.shape != logits.shape[:-1]:
            raise ValueError(f"mask {tuple(mask.shape)} must be logits.shape[:-1] = {tuple(logits.shape[:-1])}")
        self._raw_logits = logits
        self.mask = mask.to(device=logits.device, dtype=torch.bool)
        self.temperature = float(temperature)
        self.ignore_index = int(ignore_index)
        self.pad_token_id = int(pad_token_id)
        self._valid: torch.Tensor | None = None
        self._valid_lse: torch.Tensor | None = None
        super().__init__(batch_shape=logits.shape[:-1], event_shape=torch.Size(), validate_args=False)

    # --- parameters ------------------------------------------------------------------------------
    @property
    def num_events(self) -> int:
        """Vocabulary size ``V``."""
        return self._raw_logits.shape[-1]

    @property
    def logits(self) -> torch.Tensor:
        """The temperature-scaled logits ``(*batch, T, V)`` (unnormalised; masked positions as given)."""
        return self._raw_logits if self.temperature == 1.0 else self._raw_logits / self.temperature

    @property
    def probs(self) -> torch.Tensor:
        """Softmax of :attr:`logits` at every position (masked positions are not meaningful)."""
        return torch.softmax(self.logits.float(), dim=-1)

    def _valid_logits(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits of the valid positions ``(N, V)`` in >= fp32, their log-normalisers ``(N,)``), cached."""
        if self._valid is None:
            valid = self._raw_logits[self.mask]
            if valid.dtype not in (torch.float32, torch.float64):
                valid = valid.float()
            if self.temperature != 1.0:
                valid = valid / self.temperature
            self._valid = valid
            self._valid_lse = torch.logsumexp(valid, dim=-1)
        assert self._valid_lse is not None
        return self._valid, self._valid_lse

    def _scatter(self, values: torch.Tensor, prefix: torch.Size, fill: float | int) -> torch.Tensor:
        """Put per-valid-position ``values`` ``(*prefix, N)`` into a ``(*prefix, *batch, T)`` tensor."""
        out = torch.full((*prefix, *self.batch_shape), fill, dtype=values.dtype, device=values.device)
        return out.masked_scatter(self.mask.expand(out.shape), values)

    # --- distribution API ------------------------------------------------------------------------
    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """Log-prob of each token in ``value`` (``(*sample, *batch, T)``); 0 where masked off or ignored."""
        value = torch.as_tensor(value, device=self._raw_logits.device)
        if value.shape[value.ndim - len(self.batch_shape) :] != self.batch_shape:
            raise ValueError(f"tokens {tuple(value.shape)} must end with the batch shape {tuple(self.batch_shape)}")
        prefix = value.shape[: value.ndim - len(self.batch_shape)]
        valid, lse = self._valid_logits()
        tokens = value[..., self.mask].long()  # (*prefix, N)
        keep = tokens != self.ignore_index
        safe = torch.where(keep, tokens, torch.zeros_like(tokens))
        picked = valid.expand(*prefix, *valid.shape).gather(-1, safe.unsqueeze(-1)).squeeze(-1)
        lp = torch.where(keep, picked - lse, torch.zeros_like(picked))
        return self._scatter(lp, prefix, 0.0)

    def entropy(self) -> torch.Tensor:
        """Entropy of each position's next-token distribution ``(*batch, T)``; 0 where masked off."""
        valid, lse = self._valid_logits()
        probs = torch.softmax(valid, dim=-1)
        ent = lse - (probs * valid).sum(-1)
        return self._scatter(ent, torch.Size(), 0.0)

    @property
    def mode(self) -> torch.Tensor:
        """The most likely token at each position ``(*batch, T)``; ``pad_token_id`` where masked off."""
        valid, _ = self._valid_logits()
        return self._scatter(valid.argmax(-1), torch.Size(), self.pad_token_id)

    def sample(self, sample_shape: torch.Size | tuple[int, ...] = torch.Size()) -> torch.Tensor:
        """Draw tokens ``(*sample_shape, *batch, T)``; ``pad_token_id`` where masked off."""
        shape = torch.Size(sample_shape)
        valid, _ = self._valid_logits()
        with torch.no_grad():
            draws = Categorical(logits=valid.detach()).sample(shape)  # (*shape, N)
        return self._scatter(draws, shape, self.pad_token_id)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(batch_shape={tuple(self.batch_shape)}, vocab={self.num_events}, "
            f"temperature={self.temperature}, valid_positions={int(self.mask.sum())})"
        )
