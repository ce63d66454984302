"""Masked per-token reductions and KL estimators shared by the objectives.

Every objective works on padded per-token tensors of shape ``(B, T)`` plus a boolean mask of the same
shape. Padding positions may hold anything (including NaN): values are *selected* with ``torch.where``,
never multiplied by the mask, so a NaN at a padded position reaches neither the value nor the gradient.
"""

from __future__ import annotations

from typing import Literal

import torch

Aggregation = Literal["token_mean", "prompt_mean", "sequence_sum", "none"]
KLEstimator = Literal["k1", "k2", "k3"]

AGGREGATIONS: tuple[str, ...] = ("token_mean", "prompt_mean", "sequence_sum", "none")
KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3")


def masked_zero(value: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``value`` where ``mask`` is true, 0 elsewhere (selection: NaNs under the mask-off positions vanish)."""
    return torch.where(mask, value, torch.zeros((), dtype=value.dtype, device=value.device))


def masked_mean(value: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``value`` over the true positions of ``mask``; 0 when the mask is empty."""
    count = mask.sum().clamp_min(1)
    return masked_zero(value, mask).sum() / count


def aggregate(
    value: torch.Tensor,
    mask: torch.Tensor,
    aggregation: str = "token_mean",
    norm_constant: float | None = None,
) -> torch.Tensor:
    """Reduce a ``(B, T)`` per-token loss to what ``aggregation`` asks for.

    - ``token_mean``: sum over all masked tokens / number of masked tokens (long answers weigh more).
    - ``prompt_mean``: per-row masked mean, then the mean over the rows that have at least one masked
      token (each sample weighs the same; a fully masked row is left out instead of counting as 0).
    - ``sequence_sum``: Dr.GRPO -- per-row sum divided by the constant ``norm_constant`` (e.g. the
      generation budget), then the mean over all rows; no length bias from a per-row denominator.
    - ``none``: the per-token values with masked-off positions set to 0, shape ``(B, T)``.
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    selected = masked_zero(value, mask)
    if aggregation == "none":
        return selected
    if aggregation == "token_mean":
        return selected.sum() / mask.sum().clamp_min(1)
    if aggregation == "prompt_mean":
        counts = mask.sum(-1)
        row_means = selected.sum(-1) / counts.clamp_min(1)
        rows = counts > 0
        return masked_zero(row_means, rows).sum() / rows.sum().clamp_min(1)
    if norm_constant is None or norm_constant <= 0:
        raise ValueError(f"aggregation='sequence_sum' needs a positive norm_constant, got {norm_constant!r}")
    return selected.sum() / (selected.shape[0] * float(norm_constant))


def kl_estimate(log_probs: torch.Tensor, other_log_probs: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(current || other) from the log-probs of the sampled tokens.

    With ``d = other - current`` (the log-ratio other/current at the sampled token):
    ``k1 = -d`` (unbiased, high variance, can be negative), ``k2 = d**2 / 2`` (biased, low variance) and
    ``k3 = exp(d) - 1 - d`` (unbiased, non-negative, low variance; TorchRL's choice and the default).
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")
    diff = other_log_probs - log_probs
    if estimator == "k1":
        return -diff
    if estimator == "k2":
        return 0.5 * diff.square()
    return diff.expm1() - diff


def check_token_tensor(name: str, tensor: torch.Tensor, shape: torch.Size) -> None:
    """Raise a ValueError naming ``name`` when ``tensor`` is not a ``(B, T)`` tensor of ``shape``."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.shape != shape:
        raise ValueError(f"{name} must have shape {tuple(shape)} (like log_probs), got {tuple(tensor.shape)}")


def broadcast_advantages(advantages: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Accept per-sequence ``(B,)`` / ``(B, 1)`` or per-token ``(B, T)`` advantages; return ``(B, T)``."""
    if advantages.ndim == 1 and advantages.shape[0] == shape[0]:
        return advantages[:, None].expand(shape)
    if advantages.ndim == 2 and advantages.shape[0] == shape[0] and advantages.shape[1] in (1, shape[1]):
        return advantages.expand(shape)
    raise ValueError(
        f"advantages must have shape ({shape[0]},), ({shape[0]}, 1) or {tuple(shape)}, got {tuple(advantages.shape)}"
    )
