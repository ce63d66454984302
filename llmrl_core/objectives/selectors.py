"""Rejection sampling for SFT: keep the best responses of each prompt group (TorchRL's ``TopKRewardSelector``).

Semantics follow TorchRL 0.14.1 (written from scratch, applied to a whole batch instead of a replay-buffer
queue): in each group, a group whose rewards are all equal is dropped (nothing to prefer); otherwise only
responses with a reward strictly above the group's median (the lower median for an even count, as
``torch.median``) are candidates, and the ``topk_size`` best of them are kept, best first (ties keep row
order).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch


def select_top_k(
    rewards: Sequence[float] | torch.Tensor,
    group_ids: Sequence[Hashable] | torch.Tensor,
    topk_size: int,
    *,
    group_size: int | None = None,
    above_median: bool = True,
) -> list[int]:
    """Row indices to keep: per group (in first-seen order) the best ``topk_size`` rows, best first."""
    if topk_size < 1:
        raise ValueError(f"topk_size must be >= 1, got {topk_size}")
    r = torch.as_tensor(rewards, dtype=torch.float64).reshape(-1)
    ids = group_ids.reshape(-1).tolist() if isinstance(group_ids, torch.Tensor) else list(group_ids)
    if len(ids) != r.numel():
        raise ValueError(f"group_ids has {len(ids)} entries, rewards has {r.numel()}")
    if not torch.isfinite(r).all():
        raise ValueError(
            f"rewards has non-finite values at rows {torch.nonzero(~torch.isfinite(r)).reshape(-1).tolist()}"
        )
    groups: dict[Hashable, list[int]] = {}
    for row, gid in enumerate(ids):
        groups.setdefault(gid, []).append(row)
    kept: list[int] = []
    for gid, rows in groups.items():
        if group_size is not None and len(rows) != group_size:
            raise ValueError(f"group {gid!r} has {len(rows)} rows, expected group_size={group_size}")
        values = r[rows]
        if bool((values == values[0]).all()):
            continue
        threshold = float(values.median()) if above_median else -float("inf")
        candidates = [row for row in rows if float(r[row]) > threshold]
        candidates.sort(key=lambda row: -float(r[row]))  # stable: ties keep row order
        kept.extend(candidates[:topk_size])
    return kept


class TopKRewardSelector:
    """Keep the top-k responses of each prompt group (rejection-sampling data for SFT).

    Args:
        topk_size: responses kept per group (fewer when fewer are above the median).
        total_dialog_turns: TorchRL's name for the group size; when given, every group must have that many rows.
        above_median: only rows strictly above the group median are candidates (TorchRL's rule).
        group_key / rewards_key: column names used by :meth:`transform_table`.
    """

    def __init__(
        self,
        topk_size: int,
        total_dialog_turns: int | None = None,
        *,
        above_median: bool = True,
        group_key: str = "group_id",
        rewards_key: str = "reward",
    ):
        if total_dialog_turns is not None and topk_size > total_dialog_turns:
            raise ValueError(f"topk_size ({topk_size}) must be <= total_dialog_turns ({total_dialog_turns})")
        self.topk_size = topk_size
        self.total_dialog_turns = total_dialog_turns
        self.above_median = above_median
        self.group_key = group_key
        self.rewards_key = rewards_key

    def select(
        self, rewards: Sequence[float] | torch.Tensor, group_ids: Sequence[Hashable] | torch.Tensor
    ) -> list[int]:
        """Row indices to keep (see :func:`select_top_k`)."""
        return select_top_k(
            rewards, group_ids, self.topk_size, group_size=self.total_dialog_turns, above_median=self.above_median
        )

    def transform_table(self, table: Any) -> Any:
        """The selected rows of a pyarrow trajectory table, grouped, best first."""
        for key in (self.rewards_key, self.group_key):
            if key not in table.column_names:
                raise ValueError(f"trajectory table has no column {key!r} (columns: {table.column_names})")
        rewards = table.column(self.rewards_key).to_pylist()
        missing = [i for i, v in enumerate(rewards) if v is None]
        if missing:
            raise ValueError(f"trajectory table column {self.rewards_key!r} is null at rows {missing[:10]}")
        return table.take(self.select(rewards, table.column(self.group_key).to_pylist()))
