"""The policy's token distribution over a whole sequence: the wrappers' ``logits_only`` output and ``get_dist``.

``wrapper(td, logits_only=True)`` (``generate=False``) scores the sequences the wrapper reads (``history``,
``text`` or ``tokens`` input) and writes ``"logits"``: one ``(T, V)`` tensor per row, *aligned with the tokens*:
row ``t`` is the distribution token ``t`` was drawn from (the model's output at ``t - 1``). The first token has no
such distribution; its row puts all mass on the token itself (log-prob 0, entropy 0), as the wrappers' log-probs
report 0 there. :class:`LLMMaskedCategorical` is the distribution over those rows that TorchRL's ``get_dist``
returns: ``log_prob(tokens)`` and ``entropy()`` per position, 0 outside its ``mask``. :class:`CategoricalSequential`
is the same idea as a ``torch.distributions.Distribution`` over next-token logits ``(*B, T, V)`` with an optional
temperature (see its docstring for where it departs from TorchRL's older class of that name).
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch.distributions import Categorical, Distribution, constraints

from llmrl_core.data.tensors import as_padded_tensor


class LLMMaskedCategorical:
    """A categorical distribution per sequence position, ``(B, T, V)`` logits with a ``(B, T)`` bool ``mask``.

    ``log_prob(value)`` and ``entropy()`` are ``(B, T)``; masked-out positions (padding, tokens not trained on)
    are 0. ``value`` may hold ``-100`` (TorchRL's ignore index) at padding.
    """

    def __init__(self, logits: torch.Tensor, mask: torch.Tensor) -> None:
        if logits.ndim != 3 or mask.shape != logits.shape[:2]:
            shapes = f"{tuple(logits.shape)}, {tuple(mask.shape)}"
            raise ValueError(f"logits must be (B, T, V) and mask (B, T); got {shapes}")
        self.logits = logits
        self.mask = mask.bool()

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """Log-probability of each position's token in ``value`` (``(B, T)`` ids), 0 where masked out."""
        safe = torch.where(self.mask & (value >= 0), value, torch.zeros_like(value)).long()
        log_probs = torch.log_softmax(self.logits.float(), -1).gather(-1, safe.unsqueeze(-1)).squeeze(-1)
        return torch.where(self.mask, log_probs, torch.zeros_like(log_probs))

    def entropy(self) -> torch.Tensor:
        """Entropy of each position's distribution, 0 where masked out."""
        logp = torch.log_softmax(self.logits.float(), -1)
        entropy = -(logp.exp() * torch.where(torch.isfinite(logp), logp, torch.zeros_like(logp))).sum(-1)
        return torch.where(self.mask, entropy, torch.zeros_like(entropy))

    @property
    def probs(self) -> torch.Tensor:
        """``softmax(logits)`` over the vocabulary."""
        return torch.softmax(self.logits.float(), -1)


def aligned_logits(model_logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``(T, V)`` model outputs of one sequence -> rows aligned with its ``tokens`` (see the module docstring)."""
    first = torch.full_like(model_logits[:1], float("-inf"))
    first[0, int(tokens[0])] = 0.0
    return torch.cat([first, model_logits[:-1]], 0)


def logits_rows(model: Any, sequences: list[torch.Tensor], pad_token_id: int, device: torch.device) -> list[Any]:
    """Aligned logits of each sequence (one forward pass over the left-padded batch, with gradients)."""
    ids, mask = as_padded_tensor([s.cpu() for s in sequences], pad_token_id, "left", return_mask=True)
    positions = (mask.long().cumsum(-1) - 1).clamp_min(0)
    out = model(input_ids=ids.long().to(device), attention_mask=mask.to(device), position_ids=positions.to(device))
    rows = []
    for i, seq in enumerate(sequences):
        own = out.logits[i, ids.shape[1] - seq.numel() :]
        rows.append(aligned_logits(own, seq))
    return rows


def get_dist(
    wrapper: Any,
    tensordict: TensorDictBase,
    logits_key: NestedKey = "logits",
    mask_key: NestedKey | None = None,
    padding_side: str = "left",
) -> LLMMaskedCategorical:
    """TorchRL's ``get_dist``: the wrapper's ``logits_only`` output as an :class:`LLMMaskedCategorical` (mask:
    ``mask_key`` from the input, else every real token)."""
    if wrapper.generate:
        raise NotImplementedError(
            "get_dist is not implemented for generate=True. "
            "You can create a new version of this wrapper using the `get_new_version` method."
        )
    out = wrapper.forward(tensordict.copy(), logits_only=True)
    rows = out.get(logits_key, as_list=True)
    width = max(r.shape[0] for r in rows)
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")

    def pad(row: torch.Tensor) -> torch.Tensor:
        gap = width - row.shape[0]
        return torch.nn.functional.pad(row, (0, 0, gap, 0) if padding_side == "left" else (0, 0, 0, gap))

    logits = torch.stack([pad(r) for r in rows])
    real = as_padded_tensor([torch.ones(r.shape[0]) for r in rows], 0, padding_side).bool()
    if mask_key is not None:
        given = tensordict.get(mask_key, None, as_list=True)
        if given is None:
            raise KeyError(f"get_dist: no mask at {mask_key!r}")
        real = real & as_padded_tensor([torch.as_tensor(m).long() for m in given], 0, padding_side).bool()
    return LLMMaskedCategorical(logits, real)


class CategoricalSequential(Distribution):
    """Independent categoricals over the positions of token sequences, restricted to a position mask.

    Args:
        logits: unnormalised next-token scores, shape ``(*batch, T, V)``.
        mask: bool ``(*batch, T)``, True at the positions that belong to the distribution; None = all.
        temperature: the logits are divided by it (> 0); the distribution a sampler at that temperature draws.
        ignore_index: a token id that :meth:`log_prob` treats as masked off (like ``F.cross_entropy``).
        pad_token_id: the id :attr:`mode` and :meth:`sample` put at masked positions.

    ``batch_shape`` is ``(*batch, T)`` and ``event_shape`` is ``()``, as for ``torch.distributions.Categorical``.

    Where it departs from TorchRL on purpose (TorchRL's ``CategoricalSequential`` was the wrappers' base *module*,
    whose ``get_dist`` returned a ``MaskedCategorical`` with the mask inferred as ``logits != padding_value``):
    ``log_prob`` and ``entropy()`` are 0 where masked off (TorchRL's entropy there is ``log V``), computed in at least
    fp32; ``mode`` / ``sample()`` put ``pad_token_id`` at masked positions; position-level masks only, no
    ``rsample``. Only the valid positions' logits are normalised, so garbage (or -inf) padding logits are harmless.
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
