"""Per-token entries of a batch, one tensor per sample: read them back from lists, nested or dense tensors, write
them so ``td.get(key, as_list=True)`` returns them, pad them, and check the ``(..., "full")`` keys the KL
transforms use."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase, is_tensorclass, lazy_stack, unravel_key
from tensordict.utils import NestedKey
from torch.nn.utils.rnn import pad_sequence


# --- ragged / padded per-token entries ---------------------------------------------------------------
def rows_of(value: Any) -> list[torch.Tensor]:
    """One tensor per sample from what ``td.get(key, as_list=True)`` returned (list, nested or dense)."""
    if isinstance(value, torch.Tensor):
        return list(value.unbind(0))
    return list(value)


def is_dense(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and not value.is_nested


def lazy_rows(td: Any) -> LazyStackedTensorDict | None:
    inner = td._tensordict if is_tensorclass(td) else td
    if isinstance(inner, LazyStackedTensorDict) and inner.stack_dim == 0:
        return inner
    return None


def write_rows(td: TensorDictBase, key: NestedKey, rows: list[torch.Tensor]) -> None:
    """Store one tensor per sample under ``key`` so that ``td.get(key, as_list=True)`` gives them back.

    A lazily stacked TensorDict (or sub-TensorDict) gets one entry per stacked element; a dense parent is turned
    into a lazy stack of its rows; a top-level key of a dense TensorDict gets a dense tensor when the rows have
    one shape and a jagged nested tensor otherwise.
    """
    key = unravel_key(key)
    lazy = lazy_rows(td)
    if lazy is not None:
        for sub, row in zip(lazy.tensordicts, rows, strict=True):
            sub.set(key, row)
        return
    if isinstance(key, tuple) and len(key) > 1:
        parent = td.get(key[:-1], None)
        if parent is not None:
            lazy = lazy_rows(parent)
            if lazy is None:
                inner = parent._tensordict if is_tensorclass(parent) else parent
                lazy = lazy_stack(list(inner.unbind(0)))
                td.set(key[:-1], type(parent)._from_tensordict(lazy) if is_tensorclass(parent) else lazy)
        else:
            lazy = lazy_stack([TensorDict(batch_size=td.batch_size[1:]) for _ in rows])
            td.set(key[:-1], lazy)
        for sub, row in zip(lazy.tensordicts, rows, strict=True):
            sub.set(key[-1], row)
        return
    if len({tuple(r.shape) for r in rows}) <= 1:
        td.set(key, torch.stack(rows) if rows else torch.empty(0))
    else:
        td.set(key, torch.nested.as_nested_tensor(rows, layout=torch.jagged))


def pad_rows(rows: list[torch.Tensor], padding_side: str) -> torch.Tensor:
    return pad_sequence(rows, batch_first=True, padding_value=0.0, padding_side=padding_side)


def check_full_key(name: str, key: Any) -> None:
    if not isinstance(key, tuple) or key[-1] != "full":
        raise ValueError(
            f"The {name} {key} is not a tuple or does not end with 'full'. "
            "This may cause issues with the KL computation. "
            "Please use a tuple with the log_probs_key and 'full' as the last element."
        )


def on_device(td: TensorDictBase, device: torch.device | None) -> TensorDictBase:
    return td.to(device) if device is not None else td
