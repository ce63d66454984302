"""The group of each row of a TensorDict batch, as ``MCAdvantage`` and ``TopKRewardSelector`` read it: the rows'
group ids, or, when a row has none, their prompt (TorchRL groups rows by prompt)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch
from tensordict.utils import NestedKey


def column(td: Any, key: NestedKey) -> list[Any] | None:
    """A per-row field of a batch as a list (non-tensor stacks and tensors alike), or None."""
    value = td.get(key, None)
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return value.reshape(td.batch_size[0], -1)[:, 0].tolist()
    return list(value.tolist() if hasattr(value, "tolist") else value)


def row_groups(td: Any, group_key: NestedKey, prompt_key: NestedKey, owner: str) -> list[Hashable]:
    """One hashable group per row: ``group_key`` when every row has one, else ``prompt_key``; a KeyError naming
    ``owner`` when the batch has neither."""
    groups = column(td, group_key)
    if not groups or any(g is None for g in groups):
        groups = column(td, prompt_key)
    if groups is None:
        raise KeyError(f"{owner}: the batch has neither {group_key!r} (on every row) nor {prompt_key!r} to group by")
    return [g if isinstance(g, Hashable) else repr(g) for g in groups]
