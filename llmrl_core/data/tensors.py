"""Ragged-batch helpers: ``as_padded_tensor`` and ``as_nested_tensor`` (names as in TorchRL).

Conversations and responses have different lengths; the env keeps them as lists of 1-D tensors and these
helpers turn such lists into one padded tensor (with its mask) or a ``torch.nested`` jagged tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch


def _as_tensor_list(items: Sequence[torch.Tensor | Sequence[int] | Sequence[float]]) -> list[torch.Tensor]:
    tensors = []
    for index, item in enumerate(items):
        tensor = item if isinstance(item, torch.Tensor) else torch.as_tensor(list(item))
        if tensor.ndim != 1:
            raise ValueError(f"item {index} must be 1-D, got shape {tuple(tensor.shape)}")
        tensors.append(tensor)
    return tensors


def as_padded_tensor(
    items: Sequence[torch.Tensor | Sequence[int] | Sequence[float]],
    padding_value: float | int = 0,
    padding_side: Literal["left", "right"] = "right",
    return_mask: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Stack 1-D sequences of different lengths into ``(B, max_len)``, padding on ``padding_side``.

    With ``return_mask`` also returns a bool mask, True on real (non-padding) entries.
    """
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    tensors = _as_tensor_list(items)
    if not tensors:
        empty = torch.empty(0, 0)
        return (empty, empty.bool()) if return_mask else empty
    dtype = torch.result_type(tensors[0], tensors[0]) if len({t.dtype for t in tensors}) == 1 else torch.float32
    max_len = max(t.numel() for t in tensors)
    out = torch.full((len(tensors), max_len), padding_value, dtype=dtype)
    mask = torch.zeros((len(tensors), max_len), dtype=torch.bool)
    for row, tensor in enumerate(tensors):
        n = tensor.numel()
        cols = slice(0, n) if padding_side == "right" else slice(max_len - n, max_len)
        out[row, cols] = tensor.to(dtype)
        mask[row, cols] = True
    return (out, mask) if return_mask else out


def as_nested_tensor(items: Sequence[torch.Tensor | Sequence[int] | Sequence[float]]) -> torch.Tensor:
    """A ``torch.nested`` jagged tensor (layout ``torch.jagged``) of shape ``(B, j, ...)`` from 1-D items."""
    tensors = _as_tensor_list(items)
    if not tensors:
        raise ValueError("as_nested_tensor needs at least one sequence")
    return torch.nested.nested_tensor(tensors, layout=torch.jagged)
