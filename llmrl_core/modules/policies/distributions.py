"""The policy's token distribution over a whole sequence: the wrappers' ``logits_only`` output and ``get_dist``.

``wrapper(td, logits_only=True)`` (``generate=False``) scores the sequences the wrapper reads (``history``,
``text`` or ``tokens`` input) and writes ``"logits"``: one ``(T, V)`` tensor per row, *aligned with the tokens*:
row ``t`` is the distribution token ``t`` was drawn from (the model's output at ``t - 1``). The first token has no
such distribution; its row puts all mass on the token itself (log-prob 0, entropy 0), as the wrappers' log-probs
report 0 there. :class:`LLMMaskedCategorical` is the distribution over those rows that TorchRL's ``get_dist``
returns: ``log_prob(tokens)`` and ``entropy()`` per position, 0 outside its ``mask``.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey

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
