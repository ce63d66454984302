"""Per-response-token log-probs (and entropies) of a causal LM on a :class:`PackedBatch`, with gradients.

One forward pass over the packed row: ``use_cache=False`` and no attention mask, so transformers derives the
block-diagonal causal mask from the restarting position ids. The LM head runs only on the positions that
predict response tokens, and the log-softmax is taken in (at least) fp32 whatever the model's compute dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from llmrl_core.trainer.batch import PackedBatch


@dataclass
class TokenScores:
    """Padded ``(B, T)`` per-response-token results; positions beyond a response's length hold 0."""

    log_probs: torch.Tensor
    entropy: torch.Tensor | None


def _scatter(values: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    out = values.new_zeros(batch.mask.shape)
    return out.index_put((batch.rows, batch.cols), values)


def score_packed(
    model: Any, batch: PackedBatch, with_entropy: bool = False, temperature: float | None = None
) -> TokenScores:
    """Run ``model`` on ``batch`` and return the log-prob (and optionally the entropy) of each response token.

    The logits are divided by the sampling temperature first, so the log-probs (and entropies) are those of the
    distribution the sampler drew from (vLLM's processed log-probs). ``temperature=None`` uses each sample's own
    (``batch.temperatures``, 1.0 when absent); a float applies to every token (1.0: the raw distribution).
    """
    if temperature is not None and not temperature > 0:
        raise ValueError(f"temperature must be > 0 to score log-probs, got {temperature!r}")
    if batch.targets.numel() == 0:
        zeros = torch.zeros(batch.mask.shape, device=batch.mask.device)
        return TokenScores(log_probs=zeros, entropy=zeros.clone() if with_entropy else None)
    output = model(
        input_ids=batch.input_ids,
        position_ids=batch.position_ids,
        use_cache=False,
        logits_to_keep=batch.logit_positions,
    )
    logits = output.logits[0]
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()
    if temperature is not None:
        if temperature != 1.0:
            logits = logits / temperature
    elif batch.temperatures is not None:
        logits = logits / batch.temperatures.to(logits.device, logits.dtype)[:, None]
    log_normalizer = torch.logsumexp(logits, dim=-1)
    token_logits = logits.gather(-1, batch.targets[:, None]).squeeze(-1)
    log_probs = _scatter(token_logits - log_normalizer, batch)
    entropy = None
    if with_entropy:
        probs = torch.softmax(logits, dim=-1)
        entropy = _scatter(log_normalizer - (probs * logits).sum(-1), batch)
    return TokenScores(log_probs=log_probs, entropy=entropy)
