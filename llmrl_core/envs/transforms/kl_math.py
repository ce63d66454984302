"""The per-token KL estimate as pure functions (no TensorDict), as the KL transforms
(:mod:`llmrl_core.envs.transforms.kl`) compute it."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


# --- pure functions ----------------------------------------------------------------------------------
def as_float_tensor(values: Sequence[float] | torch.Tensor, name: str) -> torch.Tensor:
    if isinstance(values, torch.Tensor):
        tensor = values
    else:  # None (an unknown log-prob, e.g. a null in a stored row) becomes NaN, which the sums leave out
        tensor = torch.tensor([math.nan if v is None else float(v) for v in values], dtype=torch.float32)
    if not tensor.is_floating_point():
        tensor = tensor.float()
    if tensor.ndim == 0:
        raise ValueError(f"{name} must be a sequence of per-token values, got a scalar")
    return tensor


def token_kl(
    log_probs: Sequence[float] | torch.Tensor,
    ref_log_probs: Sequence[float] | torch.Tensor,
    mask: Sequence[bool] | torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token KL estimate ``log_probs - ref_log_probs`` (0 where ``mask`` is False).

    Inputs have one entry per token (any matching shape; ``None`` entries read as NaN); ``mask`` None counts every
    token. Non-finite entries inside the mask are returned as they are (NaN / inf) so callers can see them;
    :func:`~llmrl_core.envs.transforms.kl_computation.kl_penalties` leaves them out.
    """
    lp = as_float_tensor(log_probs, "log_probs")
    ref = as_float_tensor(ref_log_probs, "ref_log_probs").to(lp.device)
    if lp.shape != ref.shape:
        raise ValueError(f"log_probs {tuple(lp.shape)} and ref_log_probs {tuple(ref.shape)} must have the same shape")
    kl = lp - ref
    if mask is not None:
        m = mask if isinstance(mask, torch.Tensor) else torch.as_tensor(list(mask), dtype=torch.bool)
        m = m.to(device=kl.device, dtype=torch.bool)
        if m.shape != kl.shape:
            raise ValueError(f"mask {tuple(m.shape)} must have the shape of the log-probs {tuple(kl.shape)}")
        kl = torch.where(m, kl, torch.zeros_like(kl))
    return kl
