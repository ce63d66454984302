"""Rejection sampling for SFT: keep the best responses of each prompt group (TorchRL's ``TopKRewardSelector``,
whose home is ``torchrl.data.llm``; ``llmrl_core.objectives`` exports it too).

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
from tensordict import LazyStackedTensorDict
from tensordict.utils import NestedKey

from llmrl_core.data.batch_groups import row_groups


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

    Takes TorchRL's arguments in TorchRL's order (``TopKRewardSelector(total_dialog_turns, topk_size)``), but works
    on whole batches rather than as a replay-buffer transform: :meth:`transform_tensordict` on a TensorDict batch
    of finished rows, :meth:`transform_table` on a pyarrow trajectory table, :meth:`select` on plain lists.

    Args:
        total_dialog_turns: the group size; when given, every group must have that many rows.
        topk_size: responses kept per group (fewer when fewer are above the median). Required.
        prompt_key: what groups rows in a TensorDict batch when they carry no ``group_key`` (TorchRL groups by
            prompt).
        rewards_key: a TensorDict row's reward (a per-token reward counts as its mean over tokens, as in
            TorchRL); a batch with its reward at the root (llmrl's collector) is read at ``"reward"``. Its last
            part names the reward column of a table.
        done_key, verbose: TorchRL's; accepted (a batch here holds finished rows; nothing is logged).
        above_median: only rows strictly above the group median are candidates (TorchRL's rule).
        group_key: the group-id column or entry, read first.
    """

    def __init__(
        self,
        total_dialog_turns: int | None = None,
        topk_size: int | None = None,
        prompt_key: NestedKey = ("text", "prompt"),
        rewards_key: NestedKey = ("next", "reward"),
        done_key: NestedKey = ("next", "done"),
        verbose: bool = True,
        *,
        above_median: bool = True,
        group_key: str = "group_id",
    ):
        if topk_size is None:
            raise TypeError("TopKRewardSelector needs topk_size")
        if total_dialog_turns is not None and topk_size > total_dialog_turns:
            raise ValueError(
                "topk_size must be smaller than or equal to total_dialog_turns, got "
                f"topk_size={topk_size} and total_dialog_turns={total_dialog_turns}"
            )
        self.topk_size = topk_size
        self.total_dialog_turns = total_dialog_turns
        self.prompt_key = prompt_key
        self.rewards_key = rewards_key
        self.done_key = done_key
        self.verbose = verbose
        self.above_median = above_median
        self.group_key = group_key

    @property
    def reward_column(self) -> str:
        """The reward column of a trajectory table: the last part of ``rewards_key``."""
        return self.rewards_key if isinstance(self.rewards_key, str) else str(self.rewards_key[-1])

    def select(
        self, rewards: Sequence[float] | torch.Tensor, group_ids: Sequence[Hashable] | torch.Tensor
    ) -> list[int]:
        """Row indices to keep (see :func:`select_top_k`)."""
        return select_top_k(
            rewards, group_ids, self.topk_size, group_size=self.total_dialog_turns, above_median=self.above_median
        )

    def transform_table(self, table: Any) -> Any:
        """The selected rows of a pyarrow trajectory table, grouped, best first."""
        column = self.reward_column
        for key in (column, self.group_key):
            if key not in table.column_names:
                raise ValueError(f"trajectory table has no column {key!r} (columns: {table.column_names})")
        rewards = table.column(column).to_pylist()
        missing = [i for i, v in enumerate(rewards) if v is None]
        if missing:
            raise ValueError(f"trajectory table column {column!r} is null at rows {missing[:10]}")
        return table.take(self.select(rewards, table.column(self.group_key).to_pylist()))

    def transform_tensordict(self, td: Any) -> Any:
        """The selected rows of a TensorDict batch of finished rows (a collector's batch of whole groups), grouped,
        best first. Rows are grouped by ``group_key``, or by ``prompt_key`` when a row has none."""
        size = td.batch_size[0]
        keys = set(td.keys(include_nested=True, leaves_only=True))
        key = self.rewards_key if self.rewards_key in keys else "reward"
        if key not in keys:
            raise KeyError(f"TopKRewardSelector: the batch has no reward at {self.rewards_key!r} (nor 'reward')")
        parts = td.tensordicts if isinstance(td, LazyStackedTensorDict) and td.stack_dim == 0 else None
        if parts is not None:  # ragged per-token rewards: row by row
            rows = [torch.as_tensor(part.get(key), dtype=torch.float64).reshape(-1) for part in parts]
        else:
            rows = list(torch.as_tensor(td.get(key), dtype=torch.float64).reshape(size, -1))
        rewards = [float(r.mean()) for r in rows]
        groups = row_groups(td, self.group_key, self.prompt_key, "TopKRewardSelector")
        kept = self.select(rewards, groups)
        return td[torch.tensor(kept, dtype=torch.long)] if kept else td[:0]
