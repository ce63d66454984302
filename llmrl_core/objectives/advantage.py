"""Group-relative Monte-Carlo advantages (GRPO): the functional core :func:`mc_advantage` and :class:`MCAdvantage`.

Semantics follow TorchRL 0.14.1's ``MCAdvantage``. Here a whole batch of rows is at hand (read from the trajectory
store), so groups are formed in one pass; TorchRL's replay-buffer queueing (``inv``, over-sampled candidate groups)
is :mod:`llmrl_core.objectives.advantage_queue`.

- ``trajectory_return=None``: every row's reward is normalised across all rows of its group,
  ``(r - mean) / max(std, eps)`` with the unbiased std (TorchRL's per-step mode).
- ``trajectory_return="sum" | "mean" | "max"``: rows sharing an ``episode_id`` (the steps/turns of one
  multi-step episode) are reduced to one return; returns are normalised across the group's episodes and each
  episode's advantage is written to all of its rows.
- ``keep_return_bounds=(low, high)``: a group whose mean return is not strictly inside the bounds carries no
  signal (all failed / all succeeded) and is dropped (DAPO dynamic sampling): ``keep`` is False for its rows.

A group whose returns are all equal (including a group of one) gets exactly zero advantage, instead of
``rounding error / eps``.

``method`` picks how a group's returns ``r_1..r_G`` become advantages (an addition to TorchRL, which only
has the first):

- ``"grpo"`` (default): ``(r_i - mean) / max(std, eps)``, the unbiased std (DeepSeekMath's GRPO).
- ``"dr_grpo"``: ``r_i - mean``, no std division (Dr.GRPO, Liu et al. 2025, "Understanding R1-Zero-like
  training": the division up-weights groups of near-equal rewards, i.e. too easy or too hard prompts).
- ``"rloo"``: the leave-one-out baseline ``r_i - mean_{j != i} r_j``, which equals
  ``G / (G - 1) * (r_i - mean)`` (REINFORCE leave-one-out; the baseline is independent of ``r_i``).

The same methods apply to episode returns when ``trajectory_return`` is set (``G`` counts episodes).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from llmrl_core.data.batch_groups import row_groups
from llmrl_core.objectives.advantage_queue import GroupQueueWriter
from llmrl_core.objectives.group_relative import RETURN_REDUCERS, group_advantages, has_signal

TrajectoryReturn = Literal["sum", "mean", "max"]
AdvantageMethod = Literal["grpo", "dr_grpo", "rloo"]

ADVANTAGE_METHODS: tuple[str, ...] = ("grpo", "dr_grpo", "rloo")


@dataclass
class AdvantageResult:
    """Per-row advantages (0 for dropped groups), the rows to keep, and group counts."""

    advantages: torch.Tensor
    keep: torch.Tensor
    stats: dict[str, int] = field(default_factory=dict)


def _index(ids: Sequence[Hashable] | torch.Tensor, name: str, n: int) -> tuple[list[int], list[Hashable]]:
    values = ids.reshape(-1).tolist() if isinstance(ids, torch.Tensor) else list(ids)
    if len(values) != n:
        raise ValueError(f"{name} has {len(values)} entries, rewards has {n}")
    seen: dict[Hashable, int] = {}
    out = []
    for row, value in enumerate(values):
        try:
            out.append(seen.setdefault(value, len(seen)))
        except TypeError as err:
            raise TypeError(f"{name}[{row}] is not hashable: {value!r}") from err
    return out, list(seen)


def _check_method(method: str) -> None:
    if method not in ADVANTAGE_METHODS:
        raise ValueError(f"method must be one of {ADVANTAGE_METHODS}, got {method!r}")


def _check_returns(trajectory_return: str | None, keep_return_bounds: tuple[float, float] | None) -> None:
    if trajectory_return not in (None, "sum", "mean", "max"):
        raise ValueError(f"trajectory_return must be None, 'sum', 'mean' or 'max', got {trajectory_return!r}")
    if keep_return_bounds is not None:
        if trajectory_return is None:
            raise ValueError("keep_return_bounds filters on episode returns: set trajectory_return")
        if len(keep_return_bounds) != 2 or not keep_return_bounds[0] < keep_return_bounds[1]:
            raise ValueError(f"keep_return_bounds must be an increasing (low, high) pair, got {keep_return_bounds}")


def mc_advantage(
    rewards: Sequence[float] | torch.Tensor,
    group_ids: Sequence[Hashable] | torch.Tensor,
    *,
    episode_ids: Sequence[Hashable] | torch.Tensor | None = None,
    trajectory_return: TrajectoryReturn | None = None,
    keep_return_bounds: tuple[float, float] | None = None,
    eps: float = 1e-6,
    group_size: int | None = None,
    method: AdvantageMethod = "grpo",
) -> AdvantageResult:
    """Group-normalised advantages for ``N`` rows (see the module docstring).

    Args:
        rewards: ``(N,)`` one reward per row.
        group_ids: ``(N,)`` the GRPO group (prompt) of each row.
        episode_ids: ``(N,)`` the episode of each row, for multi-step episodes (default: one episode per row).
        trajectory_return: how an episode's rewards become its return; ``None`` normalises rows directly.
        keep_return_bounds: exclusive ``(low, high)`` bounds on a group's mean return (needs trajectory_return).
        eps: lower bound of the std divisor (``method="grpo"`` only).
        group_size: when given, every group must hold exactly this many episodes.
        method: ``"grpo"`` | ``"dr_grpo"`` | ``"rloo"`` (see the module docstring).
    """
    r = torch.as_tensor(rewards, dtype=torch.float64).reshape(-1)
    n = r.numel()
    if not torch.isfinite(r).all():
        rows = torch.nonzero(~torch.isfinite(r)).reshape(-1).tolist()
        raise ValueError(f"rewards has non-finite values at rows {rows}")
    _check_method(method)
    _check_returns(trajectory_return, keep_return_bounds)
    group_of_row, group_names = _index(group_ids, "group_ids", n)
    # One unit per normalised value: a row (per-step mode) or an episode (its rows reduced to one return).
    if trajectory_return is None:
        unit_rows = [[row] for row in range(n)]
        unit_value = r.clone()
    else:
        episode_keys = list(range(n)) if episode_ids is None else _index(episode_ids, "episode_ids", n)[0]
        unit_of_row, _ = _index(list(zip(group_of_row, episode_keys, strict=True)), "episode_ids", n)
        unit_rows = [[] for _ in range(max(unit_of_row, default=-1) + 1)]
        for row, unit in enumerate(unit_of_row):
            unit_rows[unit].append(row)
        reduce = RETURN_REDUCERS[trajectory_return]
        unit_value = torch.stack([reduce(r[rows]) for rows in unit_rows]) if unit_rows else r.new_zeros(0)
    unit_group = [group_of_row[rows[0]] for rows in unit_rows]

    advantages = torch.zeros(n, dtype=torch.float64)
    keep = torch.ones(n, dtype=torch.bool)
    stats = {"groups": len(group_names), "dropped_groups": 0, "zero_signal_groups": 0}
    members: list[list[int]] = [[] for _ in group_names]
    for unit, g in enumerate(unit_group):
        members[g].append(unit)
    for g, units in enumerate(members):
        if group_size is not None and len(units) != group_size:
            unit = "rows" if trajectory_return is None else "episodes"
            raise ValueError(f"group {group_names[g]!r} has {len(units)} {unit}, expected group_size={group_size}")
        values = unit_value[units]
        if keep_return_bounds is not None and not keep_return_bounds[0] < float(values.mean()) < keep_return_bounds[1]:
            stats["dropped_groups"] += 1
            for unit in units:
                keep[unit_rows[unit]] = False
            continue
        if not has_signal(values):
            stats["zero_signal_groups"] += 1
            continue
        normalised = group_advantages(values, method, eps)
        for unit, adv in zip(units, normalised.tolist(), strict=True):
            advantages[unit_rows[unit]] = adv
    stats["kept_rows"] = int(keep.sum())
    return AdvantageResult(advantages=advantages.float(), keep=keep, stats=stats)


class MCAdvantage(GroupQueueWriter):
    """Monte-Carlo (group-relative) advantage over batches of trajectory rows; TorchRL's name and options.

    ``method`` selects the advantage estimator (``"grpo"``, ``"dr_grpo"``, ``"rloo"``; see the module docstring).
    Call it on tensors (``mc_advantage`` arguments), on a TensorDict batch of whole groups
    (:meth:`transform_tensordict`), or use :meth:`transform_table` on a pyarrow table of trajectory rows: it writes
    ``advantage_key`` and drops the rows of groups outside ``keep_return_bounds``. As a replay-buffer write
    transform (TorchRL's ``inv``: trajectories queue per group until ``grpo_size`` of them, or a useful subset of up
    to ``candidate_group_size`` over-sampled candidates, are in) see :mod:`llmrl_core.objectives.advantage_queue`.
    In batch calls rows carry their ``group_key`` (``prompt_key`` when they have none).
    """

    def __init__(
        self,
        grpo_size: int | None = None,
        prompt_key: Any = "query",
        rewards_key: Any = ("next", "reward"),
        advantage_key: Any = "advantage",
        done_key: Any = ("next", "done"),
        verbose: bool = False,
        *,
        trajectory_return: TrajectoryReturn | None = None,
        keep_return_bounds: tuple[float, float] | None = None,
        candidate_group_size: int | None = None,
        candidate_selection_min_size: int | None = None,
        candidate_selector: Any = None,
        eps: float = 1e-6,
        method: AdvantageMethod = "grpo",
        group_key: str = "group_id",
        episode_key: str | None = None,
    ):
        from llmrl_core.objectives.advantage_selector import MCAdvantageSelector

        _check_returns(trajectory_return, keep_return_bounds)
        if trajectory_return is not None and grpo_size is not None and grpo_size < 2:
            raise ValueError(
                f"trajectory_return needs grpo_size >= 2 (the returns are normalised by their std over the group), "
                f"got grpo_size={grpo_size}"
            )
        size = grpo_size or 0
        candidates = size if candidate_group_size is None else int(candidate_group_size)
        min_size = size if candidate_selection_min_size is None else int(candidate_selection_min_size)
        if (candidate_group_size or candidate_selection_min_size) and grpo_size is None:
            raise ValueError("candidate_group_size / candidate_selection_min_size need grpo_size")
        if candidates < size:
            raise ValueError(f"candidate_group_size ({candidates}) must be >= grpo_size ({size})")
        if candidates > size and trajectory_return is None:
            raise ValueError(
                f"candidate_group_size={candidates} > grpo_size={size} selects candidates by their return: set "
                "trajectory_return"
            )
        if not size <= min_size <= candidates:
            raise ValueError(
                f"candidate_selection_min_size ({min_size}) must lie between grpo_size ({size}) and "
                f"candidate_group_size ({candidates})"
            )
        _check_method(method)
        self.grpo_size = grpo_size
        self.prompt_key, self.done_key, self.verbose = prompt_key, done_key, verbose
        self.trajectory_return = trajectory_return
        self.keep_return_bounds = tuple(map(float, keep_return_bounds)) if keep_return_bounds else None
        self.candidate_group_size = candidates
        self.candidate_selection_min_size = min_size
        self.candidate_selector = candidate_selector if candidate_selector is not None else MCAdvantageSelector()
        self.eps = eps
        self.method = method
        self.group_key = group_key
        self._rewards_td_key = rewards_key
        self._advantage_td_key = advantage_key
        # A table of trajectory rows names a column by the key's last part: ("next", "reward") -> "reward".
        self.rewards_key = rewards_key if isinstance(rewards_key, str) else rewards_key[-1]
        self.advantage_key = advantage_key if isinstance(advantage_key, str) else advantage_key[-1]
        self.episode_key = episode_key
        self.in_keys, self.out_keys = [prompt_key, rewards_key, done_key], [advantage_key]  # TorchRL's
        self.last_stats: dict[str, int] = {}
        self._init_queues()

    def __call__(
        self,
        rewards: Sequence[float] | torch.Tensor | Any,
        group_ids: Sequence[Hashable] | torch.Tensor | None = None,
        episode_ids: Sequence[Hashable] | torch.Tensor | None = None,
    ) -> Any:
        """Advantages for one batch of rows (see :func:`mc_advantage`); given a TensorDict of finished episodes
        (TorchRL's call), that batch with the advantages written in (:meth:`transform_tensordict`)."""
        from tensordict import TensorDictBase

        if self.grpo_size is not None and self.candidate_group_size > self.grpo_size:
            raise ValueError(
                f"MCAdvantage(candidate_group_size={self.candidate_group_size}) selects over-sampled candidates as "
                "finished trajectories arrive: write them with inv(td) (a replay-buffer write), not a batch call"
            )
        if isinstance(rewards, TensorDictBase):
            return self.transform_tensordict(rewards)
        if group_ids is None:
            raise TypeError("MCAdvantage(rewards, group_ids): group_ids is needed with a tensor of rewards")
        result = mc_advantage(
            rewards,
            group_ids,
            episode_ids=episode_ids,
            trajectory_return=self.trajectory_return,
            keep_return_bounds=self.keep_return_bounds,
            eps=self.eps,
            group_size=self.grpo_size,
            method=self.method,
        )
        self.last_stats = result.stats
        return result

    def transform_table(self, table: Any) -> Any:
        """Return ``table`` (pyarrow) with the advantage column set and dropped groups removed."""
        import pyarrow as pa

        for key in (self.rewards_key, self.group_key) + ((self.episode_key,) if self.episode_key else ()):
            if key not in table.column_names:
                raise ValueError(f"trajectory table has no column {key!r} (columns: {table.column_names})")
        rewards = table.column(self.rewards_key).to_pylist()
        missing = [i for i, v in enumerate(rewards) if v is None]
        if missing:
            raise ValueError(f"trajectory table column {self.rewards_key!r} is null at rows {missing[:10]}")
        episodes = table.column(self.episode_key).to_pylist() if self.episode_key else None
        result = self(rewards, table.column(self.group_key).to_pylist(), episodes)
        column = pa.array(result.advantages.tolist(), type=pa.float32())
        if self.advantage_key in table.column_names:
            table = table.set_column(table.column_names.index(self.advantage_key), self.advantage_key, column)
        else:
            table = table.append_column(self.advantage_key, column)
        return table.filter(pa.array(result.keep.tolist()))

    def transform_tensordict(self, td: Any) -> Any:
        """A collector batch of finished episodes (one row each) with ``advantage_key`` ``(B, 1)`` set.

        The return of a row is ``rewards_key`` (TorchRL's ``("next", "reward")``; a batch that keeps the reward at
        its root, as llmrl's collector does, is read at ``"reward"``); groups are the rows' ``group_key``, or their
        ``prompt_key`` when a row has no group id (as TorchRL groups them). With ``grpo_size`` every group must be
        complete in the batch; groups outside ``keep_return_bounds`` are dropped from the returned batch. A batch of
        dialog turns shaped ``(slots, steps)`` is read flattened, slot after slot (as TorchRL reads it), and returned
        so.
        """
        if td.batch_dims > 1:
            td = td.view(-1)
        size = td.batch_size[0]
        rewards = td.get(self._td_rewards_key(td), None)
        if rewards is None:
            raise KeyError(f"MCAdvantage: the batch has no reward at {self._rewards_td_key!r} (nor 'reward')")
        rewards = torch.as_tensor(rewards, dtype=torch.float32).reshape(size, -1).sum(-1)
        groups = row_groups(td, self.group_key, self.prompt_key, "MCAdvantage")
        if self.grpo_size is not None:
            counts: dict[Hashable, int] = {}
            for g in groups:
                counts[g] = counts.get(g, 0) + 1
            short = {g: n for g, n in counts.items() if n != self.grpo_size}
            if short:
                raise ValueError(
                    f"MCAdvantage(grpo_size={self.grpo_size}): groups {dict(list(short.items())[:5])} are not complete "
                    "in this batch (collect whole groups: DataLoadingPrimer(repeats=..., group_repeats=True))"
                )
        result = self(rewards, groups)
        td.set(self.advantage_key, result.advantages.reshape(size, 1).to(torch.float32))
        if bool(result.keep.all()):
            return td
        return td[torch.nonzero(result.keep).reshape(-1)]

    def _td_rewards_key(self, td: Any) -> Any:
        key = self._rewards_td_key
        return key if td.get(key, None) is not None else "reward"
