"""The arithmetic both forms of ``MCAdvantage`` share (a batch of whole groups, :mod:`~llmrl_core.objectives.advantage`;
trajectories queued per group, :mod:`~llmrl_core.objectives.advantage_queue`): how an episode's rewards become its
return, and how one group's returns become advantages (the methods are described in the advantage module)."""

from __future__ import annotations

from collections.abc import Callable

import torch

RETURN_REDUCERS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "sum": torch.sum,
    "mean": torch.mean,
    "max": torch.max,
}


def has_signal(values: torch.Tensor) -> bool:
    """Whether a group's returns can be told apart: at least two, not all equal."""
    return values.numel() >= 2 and not bool((values == values.reshape(-1)[0]).all())


def group_advantages(values: torch.Tensor, method: str, eps: float) -> torch.Tensor:
    """Advantages of one group's returns under ``method``; exactly zero for a group without signal (instead of
    rounding error / ``eps``)."""
    if not has_signal(values):
        return torch.zeros_like(values)
    if method == "grpo":
        return (values - values.mean()) / values.std().clamp_min(eps)
    if method == "dr_grpo":
        return values - values.mean()
    # rloo: each value minus the mean of the other G - 1 values of its group.
    size = values.numel()
    return values - (values.sum() - values) / (size - 1)


__all__ = ["RETURN_REDUCERS", "group_advantages", "has_signal"]
