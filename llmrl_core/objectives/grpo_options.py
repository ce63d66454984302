"""The enumerated options of :func:`~llmrl_core.objectives.grpo.grpo_loss` (``objective``, ``tis_mode``,
``importance_level``, ``tis_level``) and its ``clip_epsilon`` bounds, checked by ``grpo_loss`` and by
:class:`~llmrl_core.objectives.grpo.GRPOLoss` when it is built (before any model work)."""

from __future__ import annotations

import math
from typing import Any

IMPORTANCE_LEVELS: tuple[str, ...] = ("token", "sequence")
TIS_LEVELS: tuple[str, ...] = ("token", "sequence")
_CHOICES: dict[str, tuple[str, ...]] = {
    "objective": ("ppo", "cispo"),
    "tis_mode": ("truncate", "mask"),
    "importance_level": IMPORTANCE_LEVELS,
    "tis_level": TIS_LEVELS,
}


def check_choices(options: dict[str, Any]) -> None:
    """Raise a ValueError naming the option and its valid values for a bad enumerated option."""
    for name, valid in _CHOICES.items():
        if name in options and options[name] not in valid:
            raise ValueError(f"{name} must be one of {valid}, got {options[name]!r}")


def clip_bounds(clip_epsilon: float | tuple[float, float]) -> tuple[float, float]:
    """The log-space clipping bounds ``(log(1 - eps_low), log(1 + eps_high))`` of ``clip_epsilon`` (``eps`` or
    ``(eps_low, eps_high)``); a ValueError for a malformed or out-of-range value."""
    if isinstance(clip_epsilon, tuple | list):
        if len(clip_epsilon) != 2:
            raise ValueError(f"clip_epsilon must be a float or an (eps_low, eps_high) pair, got {clip_epsilon!r}")
        low, high = float(clip_epsilon[0]), float(clip_epsilon[1])
    else:
        low = high = float(clip_epsilon)
    if low < 0 or high < 0 or low >= 1:
        raise ValueError(f"clip_epsilon needs 0 <= eps_low < 1 and eps_high >= 0, got ({low}, {high})")
    return math.log1p(-low), math.log1p(high)
