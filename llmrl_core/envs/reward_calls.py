"""Calling a user's reward function: its value checked, and a failure said in one line naming the function and
the row.

A reward function (``env.rewards``) is the user's code: it may raise, or return ``None``, a string or NaN. Each
of those becomes a :class:`RewardFunctionError` naming the setting that configured the function and the row it
was scoring. ``env.reward_errors`` chooses what follows: ``raise`` (the default) stops the run with that line;
``skip`` fails the one episode (it is counted and not trained on) and the run goes on.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

import torch

from llmrl_core.user_code import UserCodeError

REWARD_ERRORS = ("raise", "skip")


class RewardFunctionError(UserCodeError):
    """A reward function raised, or returned something other than a finite number; the message names the function
    (by its setting) and the row."""


def as_reward_number(value: Any) -> float | None:
    """``value`` as a float when it is a real number (bool, int, float, a NumPy scalar, a one-element tensor)."""
    if isinstance(value, torch.Tensor):
        return float(value.item()) if value.numel() == 1 else None
    if isinstance(value, numbers.Real):
        return float(value)
    return None


def reward_value(
    fn: Callable[..., Any], label: str, prompt: str, completion: str, row: Mapping[str, Any], row_name: str
) -> float:
    """``fn(prompt, completion, row)`` as a finite float, else :class:`RewardFunctionError` (``label`` names the
    function, ``row_name`` the row)."""
    try:
        value = fn(prompt, completion, dict(row))
    except Exception as err:  # the user's code: any exception is its failure, said with the row
        raise RewardFunctionError(f"{label} raised {type(err).__name__}: {err} (scoring {row_name})") from err
    number = as_reward_number(value)
    if number is None:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise RewardFunctionError(
            f"{label} returned {type(value).__name__} {shown} (scoring {row_name}); a reward must be a number"
        )
    if not math.isfinite(number):
        raise RewardFunctionError(f"{label} returned {number} (scoring {row_name}); a reward must be finite")
    return number


def describe_row(prompt_id: Any, group_id: Any = None, sample_index: Any = None) -> str:
    """How a message names a row: its prompt id, and its place in its group when known."""
    where = f"row prompt_id={prompt_id!r}"
    if group_id is not None:
        where += f" (group {group_id}, sample {sample_index})"
    return where
